"""Who is asking, and what they may do: scopes, project bounds and actors (section 11).

Plain data, no framework: the API resolves a bearer token into a `Principal`; services
receive only its `actor`, a compact string stored beside every change they make.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

Scope = Literal["read", "register", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
ALL_PROJECTS = "*"

# A scope grants the ones below it: `register` reads what it registers, `admin` does all.
_GRANTS: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "register": frozenset({"read", "register"}),
    "admin": frozenset({"read", "register", "admin"}),
}

# Actors that are not tokens. A change made by executing a policy's action is recorded as
# that rule (`rule_actor`), the way a purge carries the rule of its delete.
ANONYMOUS_ACTOR = "anonymous"  # CKPT_AUTH=off: the embedded quick start on a loopback address
SCHEDULER_ACTOR = "system:scheduler"  # periodic sweeps and registration-triggered evaluations
POLICY_FILES_ACTOR = "system:policy-files"  # policies loaded from CKPT_POLICIES_DIR at start
RECONCILE_ACTOR = "system:reconcile"  # the scheduled reconciliation (checkpoint health)
BOOTSTRAP_ACTOR = "system:bootstrap"  # the CKPT_BOOTSTRAP_TOKEN row


def token_actor(token_id: str, name: str) -> str:
    return f"token:{token_id}:{name}"


def rule_actor(rule: str) -> str:
    """`rule:<policy>/<rule>` for what a policy rule planned; `manual` is not a rule."""
    return f"rule:{rule}"


def granted(scopes: Iterable[str]) -> frozenset[str]:
    """Every scope that `scopes` grant, implied ones included."""
    out: frozenset[str] = frozenset()
    for scope in scopes:
        out |= _GRANTS.get(scope, frozenset())
    return out


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request.

    `projects` is None when nothing bounds the caller (admin, `*`, or no access control);
    otherwise the project names it may see and touch.
    """

    actor: str
    scopes: frozenset[str]
    projects: frozenset[str] | None
    token_id: str | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    def sees(self, project: str) -> bool:
        return self.projects is None or project in self.projects


def token_principal(
    token_id: str, name: str, scopes: Iterable[str], projects: Iterable[str]
) -> Principal:
    allowed = granted(scopes)
    listed = frozenset(projects)
    bounded = "admin" not in allowed and ALL_PROJECTS not in listed
    return Principal(
        actor=token_actor(token_id, name),
        scopes=allowed,
        projects=listed if bounded else None,
        token_id=token_id,
    )


# Every check passes: the quick start with CKPT_AUTH=off.
ANONYMOUS = Principal(actor=ANONYMOUS_ACTOR, scopes=granted(SCOPES), projects=None)
# A caller of an open route (liveness), who is granted nothing.
NOBODY = Principal(actor=ANONYMOUS_ACTOR, scopes=frozenset(), projects=frozenset())

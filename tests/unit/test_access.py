"""Scopes, project bounds and actors: the pure rules behind access control."""

from __future__ import annotations

import hashlib

import pytest

from app.domain.access import ANONYMOUS, granted, rule_actor, token_principal
from app.domain.errors import Invalid
from app.services.catalog.tokens import SECRET_PREFIX, hash_secret, new_secret, normalise_grant


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        (["read"], {"read"}),
        (["register"], {"read", "register"}),
        (["admin"], {"read", "register", "admin"}),
        (["read", "register"], {"read", "register"}),
        ([], set()),
        (["root"], set()),
    ],
)
def test_a_scope_grants_the_ones_below_it(scopes: list[str], expected: set[str]) -> None:
    assert granted(scopes) == expected


def test_projects_bound_read_and_register_tokens_only() -> None:
    reader = token_principal("tok_1", "reader", ["read"], ["llama", "gpt"])
    assert reader.projects == frozenset({"llama", "gpt"})
    assert reader.sees("llama") and not reader.sees("bert")
    assert reader.allows("read") and not reader.allows("register")
    assert reader.actor == "token:tok_1:reader"
    everywhere = token_principal("tok_2", "all", ["register"], ["*"])
    assert everywhere.projects is None and everywhere.sees("anything")
    admin = token_principal("tok_3", "ops", ["admin"], ["*"])
    assert admin.projects is None and admin.allows("admin")


def test_anonymous_may_do_everything() -> None:
    assert ANONYMOUS.actor == "anonymous"
    assert all(ANONYMOUS.allows(s) for s in ("read", "register", "admin"))
    assert ANONYMOUS.sees("any")


def test_rule_actor_names_policy_and_rule() -> None:
    assert rule_actor("llm-default/rolling-keep-3") == "rule:llm-default/rolling-keep-3"


def test_secrets_are_random_prefixed_and_stored_as_sha256() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    for secret in secrets:
        assert secret.startswith(SECRET_PREFIX) and len(secret) >= 40
        assert hash_secret(secret) == hashlib.sha256(secret.encode()).hexdigest()


@pytest.mark.parametrize(
    ("scopes", "projects", "expected"),
    [
        (["read"], ["b", "a", "a"], (["read"], ["a", "b"])),
        (["register", "read"], ["*"], (["read", "register"], ["*"])),
        (["admin"], None, (["admin"], ["*"])),
        (["admin"], ["*"], (["admin"], ["*"])),
    ],
)
def test_grants_are_normalised(
    scopes: list[str], projects: list[str] | None, expected: tuple[list[str], list[str]]
) -> None:
    assert normalise_grant(scopes, projects) == expected


@pytest.mark.parametrize(
    ("scopes", "projects", "field"),
    [
        ([], ["*"], "scopes"),
        (["superuser"], ["*"], "scopes"),
        (["read"], None, "projects"),
        (["register"], [], "projects"),
        (["read"], ["*", "llama"], "projects"),
        (["read"], ["Llama"], "projects"),
        (["admin"], ["llama"], "projects"),
    ],
)
def test_bad_grants_are_refused(scopes: list[str], projects: list[str] | None, field: str) -> None:
    with pytest.raises(Invalid) as caught:
        normalise_grant(scopes, projects)
    assert caught.value.field == field

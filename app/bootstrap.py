"""What a process does once at start, before it serves: the policy files into the
database (where every replica reads them) and the bootstrap admin token. Shared by the
API (app.main) and the commands (app.cli), each in a transaction of its own."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from app.db.session import session_scope
from app.domain.access import ALL_PROJECTS, BOOTSTRAP_ACTOR, POLICY_FILES_ACTOR
from app.domain.tier import Tier
from app.policy.loading import load_policy_files
from app.services.catalog.due_runs import mark_all
from app.services.catalog.policies import store_policy
from app.services.catalog.tokens import count_live_admin_tokens, ensure_token
from app.settings import Settings

log = logging.getLogger("app.main")


def load_policies_into(
    factory: sessionmaker[Session], settings: Settings, tier_list: list[Tier]
) -> None:
    """Store the validated policy files in the database, where every replica reads them."""
    files = load_policy_files(settings.policies_dir, [t.name for t in tier_list])
    with session_scope(factory) as session:
        for path, policy in files:
            store_policy(
                session, policy, source=str(path), actor=POLICY_FILES_ACTOR, now=datetime.now(UTC)
            )
        # The tiers (their ranks) may differ from the last start's: the next sweep is whole.
        mark_all(session, datetime.now(UTC))


def bootstrap_token(factory: sessionmaker[Session], settings: Settings) -> None:
    """Seed the CKPT_BOOTSTRAP_TOKEN admin token if absent (several replicas may start at
    once: one insert that ignores a conflict), and say when nobody could get in."""
    with session_scope(factory) as session:
        if settings.bootstrap_token is not None:
            token, created = ensure_token(
                session,
                name="bootstrap",
                secret=settings.bootstrap_token.get_secret_value(),
                scopes=["admin"],
                projects=[ALL_PROJECTS],
                actor=BOOTSTRAP_ACTOR,
                now=datetime.now(UTC),
            )
            if created:
                log.info("bootstrap token created", extra={"token_id": token.id})
            elif token.revoked_at is not None:
                log.warning(
                    "CKPT_BOOTSTRAP_TOKEN is a revoked token: it stays revoked",
                    extra={"token_id": token.id},
                )
        if settings.auth == "on" and count_live_admin_tokens(session) == 0:
            log.warning(
                "no admin token exists: set CKPT_BOOTSTRAP_TOKEN and restart, then make "
                "others with `ckpt tokens create`"
            )

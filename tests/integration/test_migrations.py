"""The models and the Alembic migrations describe the same schema, on both databases."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, insert, inspect, select, text

from app.db.migrate import downgrade, upgrade
from app.db.models import Base, Checkpoint
from app.db.session import make_engine
from tests.conftest import create_pg_database, drop_pg_database, postgres_url

APP_TABLES = set(Base.metadata.tables)
CKPT = Path(sys.executable).parent / "ckpt"


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of its own for each test (not the shared session database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    name = create_pg_database()
    try:
        yield postgres_url(name)
    finally:
        drop_pg_database(name)


@pytest.fixture
def fresh_engine(fresh_url: str) -> Iterator[Engine]:
    engine = make_engine(fresh_url, pool_size=1)
    yield engine
    engine.dispose()


def schema_differences(engine: Engine) -> list[Any]:
    """What autogenerate would write to bring the database to the models; [] when equal.

    compare_type compares a TypeDecorator (UTCDateTime) by its impl, DateTime(timezone=True).
    """
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "compare_server_default": True}
        )
        return list(compare_metadata(context, Base.metadata))


def table_names(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_upgrade_creates_every_model_table(fresh_url: str, fresh_engine: Engine) -> None:
    assert not table_names(fresh_engine) & APP_TABLES
    upgrade(fresh_url)
    assert table_names(fresh_engine) >= APP_TABLES


def test_models_and_migrations_agree(fresh_url: str, fresh_engine: Engine) -> None:
    upgrade(fresh_url)
    assert schema_differences(fresh_engine) == []


def test_comparison_sees_a_drift(fresh_url: str, fresh_engine: Engine) -> None:
    """The comparison above is not blind: a schema changed behind the models' back shows."""
    upgrade(fresh_url)
    with fresh_engine.begin() as connection:
        connection.execute(text("DROP INDEX ix_runs_status_ended_at"))
        connection.execute(text("ALTER TABLE runs ADD COLUMN stray INTEGER"))
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("ALTER TABLE runs ALTER COLUMN started_at TYPE timestamp without time zone")
            )
    kinds = set()
    for diff in schema_differences(fresh_engine):
        for change in diff if isinstance(diff, list) else [diff]:
            kinds.add((change[0], change[2] if change[0] == "modify_type" else None))
    assert ("add_index", None) in kinds
    assert ("remove_column", None) in kinds
    if fresh_engine.dialect.name == "postgresql":
        assert ("modify_type", "runs") in kinds


def test_upgrade_is_idempotent(fresh_url: str, fresh_engine: Engine) -> None:
    upgrade(fresh_url)
    upgrade(fresh_url)
    assert schema_differences(fresh_engine) == []


def test_downgrade_to_base_and_upgrade_again(fresh_url: str, fresh_engine: Engine) -> None:
    upgrade(fresh_url)
    downgrade(fresh_url, "base")
    assert table_names(fresh_engine) & APP_TABLES == set()
    assert table_names(fresh_engine) <= {"alembic_version"}
    with fresh_engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() is None
    upgrade(fresh_url)
    assert table_names(fresh_engine) >= APP_TABLES
    assert schema_differences(fresh_engine) == []


@pytest.mark.parametrize("fresh_url", ["postgresql"], indirect=True)  # replicas: production
def test_replicas_starting_together_migrate_once(fresh_url: str, fresh_engine: Engine) -> None:
    """Every process upgrades at start; four `ckpt migrate` at once on an empty PostgreSQL
    take turns (an advisory lock), so none fails on tables another has just created."""
    env = {**os.environ, "CKPT_DATABASE_URL": fresh_url, "CKPT_AUTH": "off"}
    processes = [
        subprocess.Popen(
            [str(CKPT), "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [p.returncode for p in processes] == [0] * 4, outputs
    assert table_names(fresh_engine) >= APP_TABLES
    assert schema_differences(fresh_engine) == []
    with fresh_engine.connect() as connection:
        versions = connection.execute(text("SELECT count(*) FROM alembic_version")).scalar()
    assert versions == 1


def test_reservations_made_before_reserved_until_get_a_full_ttl(
    fresh_url: str, fresh_engine: Engine
) -> None:
    """A save in flight while the service upgrades is not aborted the moment the new
    scheduler starts: its reservation lasts the default TTL from the upgrade on."""
    upgrade(fresh_url, "0007")
    now = datetime.now(UTC)
    with fresh_engine.begin() as connection:
        connection.execute(
            insert(Base.metadata.tables["projects"]).values(id=1, name="p", created_at=now)
        )
        connection.execute(
            insert(Base.metadata.tables["runs"]).values(
                id="run_1", project_id=1, name="r", status="active", started_at=now
            )
        )
        for step, state in ((1, "writing"), (2, "active")):
            connection.execute(
                insert(Base.metadata.tables["checkpoints"]).values(
                    id=f"ckpt_{step}",
                    run_id="run_1",
                    step=step,
                    state=state,
                    **{"class": "rolling"},
                    uri=f"file:///data/hot/p/r/step-{step}",
                    created_at=now,
                    registered_at=now,
                )
            )
    upgrade(fresh_url)
    with fresh_engine.connect() as connection:
        rows = {
            checkpoint_id: until
            for checkpoint_id, until in connection.execute(
                select(Checkpoint.id, Checkpoint.reserved_until)
            )
        }
    assert rows["ckpt_2"] is None
    reserved = rows["ckpt_1"]
    assert reserved is not None
    assert now + timedelta(minutes=29) < reserved < datetime.now(UTC) + timedelta(minutes=31)


def test_checkpoints_catalogued_before_the_upgrade_carry_their_primary_tier(
    fresh_url: str, fresh_engine: Engine
) -> None:
    """A plan reads a checkpoint's tier from its row (0014): a catalog written before
    learns it from the primary location, not from a replica, and a checkpoint whose bytes
    are gone has none. A missed row would be planned as if it were on no tier."""
    upgrade(fresh_url, "0013")
    now = datetime.now(UTC)
    tables = Base.metadata.tables
    with fresh_engine.begin() as connection:
        connection.execute(insert(tables["projects"]).values(id=1, name="p", created_at=now))
        connection.execute(
            insert(tables["runs"]).values(
                id="run_1", project_id=1, name="r", status="active", started_at=now
            )
        )
        placed = {
            "ckpt_hot": [("hot", "primary")],
            "ckpt_moved": [("hot", "replica"), ("cold", "primary")],
            "ckpt_gone": [],
        }
        for step, (checkpoint_id, where) in enumerate(placed.items()):
            connection.execute(
                insert(tables["checkpoints"]).values(
                    id=checkpoint_id,
                    run_id="run_1",
                    step=step,
                    state="deleted" if not where else "active",
                    **{"class": "milestone"},
                    uri=f"file:///data/{checkpoint_id}",
                    created_at=now,
                    registered_at=now,
                )
            )
            for tier, role in where:
                connection.execute(
                    insert(tables["locations"]).values(
                        checkpoint_id=checkpoint_id,
                        tier=tier,
                        uri=f"file:///data/{tier}/{checkpoint_id}",
                        role=role,
                    )
                )
    upgrade(fresh_url)
    with fresh_engine.connect() as connection:
        tiers = dict(connection.execute(select(Checkpoint.id, Checkpoint.tier)).all())
    assert tiers == {"ckpt_hot": "hot", "ckpt_moved": "cold", "ckpt_gone": None}

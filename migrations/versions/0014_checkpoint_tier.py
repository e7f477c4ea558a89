"""checkpoints.tier: the primary location's tier on the checkpoint's row

A plan reads every active checkpoint with its primary tier; kept on the row (as its uri
already is), that read no longer joins every primary location. This release writes the
column with the primary in every change of it. The triggers keep it in step when a
primary location is moved or removed by anything else: the previous release's workers
while this one rolls out (or after a rollback), or an admin's SQL. A checkpoint such a
writer inserts has no tier on its row; a plan then reads its primary's
(app.services.lifecycle.snapshot). A later migration that rebuilds `locations` on SQLite
(batch_alter_table) must create these triggers again.

The backfill rewrites every checkpoint row once: 14 s for a million checkpoints on
PostgreSQL on two cores, the table twice its size until it is vacuumed.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POSTGRESQL = [
    """CREATE FUNCTION ckpt_primary_tier_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE checkpoints SET tier = NEW.tier
        WHERE id = NEW.checkpoint_id AND tier IS DISTINCT FROM NEW.tier;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION ckpt_primary_tier_gone() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE checkpoints SET tier = NULL WHERE id = OLD.checkpoint_id AND tier IS NOT NULL;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER locations_primary_moved AFTER UPDATE OF tier, role ON locations
    FOR EACH ROW WHEN (NEW.role = 'primary') EXECUTE FUNCTION ckpt_primary_tier_moved()""",
    """CREATE TRIGGER locations_primary_gone AFTER DELETE ON locations
    FOR EACH ROW WHEN (OLD.role = 'primary') EXECUTE FUNCTION ckpt_primary_tier_gone()""",
]
_SQLITE = [
    """CREATE TRIGGER locations_primary_moved AFTER UPDATE OF tier, role ON locations
    FOR EACH ROW WHEN NEW.role = 'primary' BEGIN
        UPDATE checkpoints SET tier = NEW.tier
        WHERE id = NEW.checkpoint_id AND tier IS NOT NEW.tier;
    END""",
    """CREATE TRIGGER locations_primary_gone AFTER DELETE ON locations
    FOR EACH ROW WHEN OLD.role = 'primary' BEGIN
        UPDATE checkpoints SET tier = NULL WHERE id = OLD.checkpoint_id AND tier IS NOT NULL;
    END""",
]


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("tier", sa.String(63), nullable=True))
    # A correlated subquery rather than UPDATE ... FROM: the same statement on both
    # databases, each row found by the (checkpoint_id, tier) unique index.
    op.execute(
        "UPDATE checkpoints SET tier = (SELECT l.tier FROM locations l "
        "WHERE l.checkpoint_id = checkpoints.id AND l.role = 'primary' ORDER BY l.id LIMIT 1)"
    )
    # An insert is not watched: it is every registration's and every import's, and a
    # checkpoint inserted without its tier is read through its primary instead.
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in _POSTGRESQL if postgresql else _SQLITE:
        op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    on = " ON locations" if postgresql else ""
    for trigger in ("locations_primary_moved", "locations_primary_gone"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}{on}")
    if postgresql:
        op.execute("DROP FUNCTION IF EXISTS ckpt_primary_tier_moved()")
        op.execute("DROP FUNCTION IF EXISTS ckpt_primary_tier_gone()")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("tier")

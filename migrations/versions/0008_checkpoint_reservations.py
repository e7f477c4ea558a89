"""reservations: the end of a `writing` checkpoint's reservation

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 06:30:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Reservations made before the column existed get the default TTL from the upgrade on, so
# the scheduler does not abort a save that may still be running the moment it starts.
LEGACY_TTL = timedelta(minutes=30)


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("reserved_until", app.db.types.UTCDateTime(timezone=True), nullable=True)
        )
    checkpoints = sa.table(
        "checkpoints",
        sa.column("state", sa.String()),
        sa.column("reserved_until", app.db.types.UTCDateTime(timezone=True)),
    )
    op.execute(
        checkpoints.update()
        .where(checkpoints.c.state == "writing")
        .values(reserved_until=datetime.now(UTC) + LEGACY_TTL)
    )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("reserved_until")

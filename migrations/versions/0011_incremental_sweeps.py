"""incremental sweeps: when each run is next due for evaluation

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: not evaluated since the upgrade, so the first sweep evaluates every run.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("next_due_at", app.db.types.UTCDateTime(), nullable=True))
    op.create_index("ix_runs_next_due_at", "runs", ["next_due_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_next_due_at", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("next_due_at")

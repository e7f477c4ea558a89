"""checkpoints.tier: the primary location's tier on the checkpoint's row

A plan reads every active checkpoint with its primary tier; kept on the row (as its uri
already is), that read no longer joins every primary location.

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


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("tier", sa.String(63), nullable=True))
    # A correlated subquery rather than UPDATE ... FROM: the same statement on both
    # databases, each row found by the (checkpoint_id, tier) unique index.
    op.execute(
        "UPDATE checkpoints SET tier = (SELECT l.tier FROM locations l "
        "WHERE l.checkpoint_id = checkpoints.id AND l.role = 'primary' ORDER BY l.id LIMIT 1)"
    )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("tier")

"""provider realities: bytes billed after a delete, and checkpoints a provider's lock keeps

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("locked_until", app.db.types.UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("lock_reason", sa.Text(), nullable=True))
    op.create_table(
        "deleted_bytes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("action_id", sa.String(length=40), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=40), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("class", sa.String(length=63), nullable=False),
        sa.Column("tier", sa.String(length=63), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("deleted_at", app.db.types.UTCDateTime(), nullable=False),
        sa.Column("billed_until", app.db.types.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_deleted_bytes_billed_until", "deleted_bytes", ["billed_until"])


def downgrade() -> None:
    op.drop_index("ix_deleted_bytes_billed_until", table_name="deleted_bytes")
    op.drop_table("deleted_bytes")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("lock_reason")
        batch.drop_column("locked_until")

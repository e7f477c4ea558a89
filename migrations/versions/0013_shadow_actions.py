"""shadow ledger: the would-be actions of shadow policies

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shadow_actions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("policy", sa.String(length=63), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("from_tier", sa.String(length=63), nullable=True),
        sa.Column("to_tier", sa.String(length=63), nullable=True),
        sa.Column("rule", sa.String(length=140), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", app.db.types.UTCDateTime(), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("sweep_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["checkpoints.id"],
            name=op.f("fk_shadow_actions_checkpoint_id_checkpoints"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_shadow_actions_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shadow_actions")),
    )
    op.create_index(
        "ix_shadow_actions_policy_created_at", "shadow_actions", ["policy", "created_at"]
    )
    op.create_index("ix_shadow_actions_checkpoint_id", "shadow_actions", ["checkpoint_id"])
    op.create_index("ix_shadow_actions_run_id", "shadow_actions", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_shadow_actions_run_id", table_name="shadow_actions")
    op.drop_index("ix_shadow_actions_checkpoint_id", table_name="shadow_actions")
    op.drop_index("ix_shadow_actions_policy_created_at", table_name="shadow_actions")
    op.drop_table("shadow_actions")

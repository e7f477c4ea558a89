"""audit trail, checkpoint health, storage retries per action

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 01:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", app.db.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("entity", sa.String(length=16), nullable=False),
        sa.Column("entity_id", sa.String(length=140), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=40), nullable=True),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_actor_id", ["actor", "id"], unique=False)
        batch_op.create_index("ix_audit_events_at", ["at"], unique=False)
        batch_op.create_index(
            "ix_audit_events_checkpoint_id_id", ["checkpoint_id", "id"], unique=False
        )
        batch_op.create_index("ix_audit_events_run_id_id", ["run_id", "id"], unique=False)

    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("retries", sa.Integer(), server_default="0", nullable=False)
        )

    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("health", sa.String(length=16), server_default="ok", nullable=False)
        )
        batch_op.add_column(sa.Column("health_detail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("health_detail")
        batch_op.drop_column("health")

    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_column("retries")

    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_run_id_id")
        batch_op.drop_index("ix_audit_events_checkpoint_id_id")
        batch_op.drop_index("ix_audit_events_at")
        batch_op.drop_index("ix_audit_events_actor_id")

    op.drop_table("audit_events")

"""index checkpoints.locked_until: every plan asks which checkpoints the provider locks

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 16:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_checkpoints_locked_until", "checkpoints", ["locked_until"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_locked_until", table_name="checkpoints")

"""single-file checkpoints, undelete protection, action progress, location lookups by uri

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("single_file", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(
            sa.Column(
                "protected_until", app.db.types.UTCDateTime(timezone=True), nullable=True
            )
        )

    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("bytes_done", sa.BigInteger(), server_default="0", nullable=False)
        )

    # Overlap checks look locations up by equal uri and by uri prefix: text_pattern_ops
    # lets PostgreSQL answer a LIKE 'prefix%' from the index whatever the database's
    # collation; SQLite compares bytes and uses a plain index for the range.
    with op.batch_alter_table("locations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_locations_uri",
            ["uri"],
            unique=False,
            postgresql_ops={"uri": "text_pattern_ops"},
        )


def downgrade() -> None:
    with op.batch_alter_table("locations", schema=None) as batch_op:
        batch_op.drop_index("ix_locations_uri")

    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_column("bytes_done")

    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("protected_until")
        batch_op.drop_column("single_file")

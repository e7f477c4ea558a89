"""imports: adopting existing checkpoint trees, and what each registered

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "imports",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("tier", sa.String(length=63), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("layout", sa.String(length=16), nullable=False),
        sa.Column("run", sa.String(length=63), nullable=True),
        sa.Column("class", sa.String(length=63), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("listed", sa.BigInteger(), nullable=False),
        sa.Column("discovered", sa.BigInteger(), nullable=False),
        sa.Column("registered", sa.BigInteger(), nullable=False),
        sa.Column("existing", sa.BigInteger(), nullable=False),
        sa.Column("runs", sa.BigInteger(), nullable=False),
        sa.Column("unrecognized", sa.BigInteger(), nullable=False),
        sa.Column("incomplete_count", sa.BigInteger(), nullable=False),
        sa.Column("skipped_count", sa.BigInteger(), nullable=False),
        sa.Column("incomplete", sa.JSON(), nullable=False),
        sa.Column("skipped", sa.JSON(), nullable=False),
        sa.Column("unrecognized_sample", sa.JSON(), nullable=False),
        sa.Column("bytes_registered", sa.BigInteger(), nullable=False),
        sa.Column("cursor", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sweep_id", sa.String(length=40), nullable=True),
        sa.Column("owner", sa.String(length=40), nullable=True),
        sa.Column("lease_until", app.db.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", app.db.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", app.db.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", app.db.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_imports")),
    )
    with op.batch_alter_table("imports", schema=None) as batch_op:
        batch_op.create_index(
            "ix_imports_state_lease_until", ["state", "lease_until"], unique=False
        )

    op.create_table(
        "import_items",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("import_id", sa.String(length=40), nullable=False),
        sa.Column("run", sa.String(length=63), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("class", sa.String(length=63), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", app.db.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("layout", sa.String(length=16), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["import_id"], ["imports.id"], name=op.f("fk_import_items_import_id_imports")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_import_items")),
    )
    with op.batch_alter_table("import_items", schema=None) as batch_op:
        batch_op.create_index(
            "ix_import_items_import_id_id", ["import_id", "id"], unique=False
        )
        batch_op.create_index(
            "ix_import_items_import_id_run_step", ["import_id", "run", "step"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("import_items", schema=None) as batch_op:
        batch_op.drop_index("ix_import_items_import_id_run_step")
        batch_op.drop_index("ix_import_items_import_id_id")
    op.drop_table("import_items")
    with op.batch_alter_table("imports", schema=None) as batch_op:
        batch_op.drop_index("ix_imports_state_lease_until")
    op.drop_table("imports")

"""record the oldest code revision that can run against the schema (expand-then-contract)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

``autospec_schema``: one row, ``(revision, min_reader)``. Every migration declares
``backward_compatible``: True when it only *expands* the schema (a new table, a nullable or
defaulted column, a new index), so the code of the revision before it keeps working against
it. After each migration run autospec records the oldest code revision that can still run
against the schema (walking back over backward-compatible migrations), and a replica or
controller whose code is older than the database accepts it when it is at least that
revision (``autospec db current``: ``ahead-compatible``). This table is itself additive.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None
backward_compatible = True  # a new table only: code at 0006 runs against it unchanged


def upgrade() -> None:
    op.create_table(
        'autospec_schema',
        sa.Column('revision', sa.String(length=32), nullable=False),
        sa.Column('min_reader', sa.String(length=32), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('revision', name=op.f('pk_autospec_schema')),
    )


def downgrade() -> None:
    op.drop_table('autospec_schema')

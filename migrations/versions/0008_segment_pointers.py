"""a live version per traffic segment

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``segment_pointers``: ``(deployment, segment) -> version`` with the previous version and a
generation, like ``live_pointer``. A request whose segment has a row is drafted by that
version; every other request by the deployment's live pointer. Moved by ``autospec promote
--segment`` / ``rollback --segment`` and by a controller cycle whose policy promotes per
segment; every move is an audit event with ``details.segment``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None
backward_compatible = True  # a new table only: code at 0007 runs against it unchanged


def upgrade() -> None:
    op.create_table(
        'segment_pointers',
        sa.Column('deployment', sa.String(length=64), nullable=False),
        sa.Column('segment', sa.String(length=64), nullable=False),
        sa.Column('version', sa.String(length=64), nullable=False),
        sa.Column('previous_version', sa.String(length=64), nullable=True),
        sa.Column('generation', sa.Integer(), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.Column('updated_by', sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(['previous_version'], ['speculators.version'],
                                name=op.f('fk_segment_pointers_previous_version_speculators')),
        sa.ForeignKeyConstraint(['version'], ['speculators.version'],
                                name=op.f('fk_segment_pointers_version_speculators')),
        sa.PrimaryKeyConstraint('deployment', 'segment', name=op.f('pk_segment_pointers')),
    )


def downgrade() -> None:
    op.drop_table('segment_pointers')

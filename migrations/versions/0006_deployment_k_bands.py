"""deployments carry the policy's draft tokens per concurrency band

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``deployments.k_bands``: the bands a controller's policy sets (``serving.k_bands``, e.g.
``1-2:5,3-:0``; :mod:`autospec.serve.bands`), which every replica of the deployment reads as
it follows the live pointer and drafts by; NULL: the replicas' own ``k_bands`` (their serve
config), or none. Written by the controller, never by a replica's start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match


def upgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.add_column(sa.Column('k_bands', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.drop_column('k_bands')

"""deployments record the engine their replicas decode with

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``deployments.engine``: ``native`` (autospec's engine) or ``vllm``, written by every replica
with the numerics it serves, so the controller refuses a policy whose candidates the
serving engine cannot run before it trains them. Rows written before this revision were
written by native replicas (the only engine then).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match


def upgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.add_column(sa.Column('engine', sa.String(length=16), nullable=False,
                                   server_default='native'))


def downgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.drop_column('engine')

"""deployments record the CPU threads their replicas decode with

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``deployments.threads``: torch's CPU thread count in the replica (Ray gives a replica
``OMP_NUM_THREADS`` = its ``num_cpus``; 1 by default), NULL for a GPU replica. The
controller measures a candidate's speedup on as many threads, because a verify of k+1
tokens costs relatively more on one thread than on several, and a speedup measured on the
controller's threads did not hold in serving. Rows written before this revision read NULL
(unknown: the controller measures on its own threads, as before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match


def upgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.add_column(sa.Column('threads', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('deployments') as batch:
        batch.drop_column('threads')

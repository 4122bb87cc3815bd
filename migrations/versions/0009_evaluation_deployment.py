"""evaluations name the deployment whose traffic they replayed

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

``evaluations.deployment``: the deployment whose held-out traffic the evaluation replayed
(a cycle's, or ``autospec evaluate --deployment``'s). Readers that take an evaluation as
evidence for one deployment — ``promote``, the canary and drift baselines, ``status`` — read
that deployment's evaluations and the rows from before this column (NULL), so a store that
serves several deployments no longer judges one on another's traffic.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None
backward_compatible = True  # a nullable column and its index: code at 0008 runs unchanged


def upgrade() -> None:
    with op.batch_alter_table('evaluations') as batch:
        batch.add_column(sa.Column('deployment', sa.String(length=64), nullable=True))
        batch.create_index(batch.f('ix_evaluations_deployment'), ['deployment'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('evaluations') as batch:
        batch.drop_index(batch.f('ix_evaluations_deployment'))
        batch.drop_column('deployment')

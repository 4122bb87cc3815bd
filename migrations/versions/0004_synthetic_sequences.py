"""synthetic sequences: target-generated training data, apart from traffic

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

- ``synthetic_sequences``: what ``autospec synth`` had the target answer (logged prompts
  resampled at temperature > 0, prompts of the workload domains sampled or greedy at
  temperature 0), marked with its source,
  its split (``train`` / ``heldout``, the latter only for the overfitting guard) and the
  target id, revision and dtype it was generated with. A table of its own, so no traffic
  query (windows, held-out sets, live τ) can ever read a synthetic row as traffic.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('synthetic_sequences',
    sa.Column('id', _ID, autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('split', sa.String(length=16), nullable=False),
    sa.Column('target_id', sa.String(length=200), nullable=False),
    sa.Column('target_revision', sa.String(length=64), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('prompt_ids', sa.LargeBinary(), nullable=False),
    sa.Column('output_ids', sa.LargeBinary(), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('temperature', sa.Float(), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=True),
    sa.Column('origin_request_id', sa.BigInteger(), nullable=True),
    sa.CheckConstraint("split IN ('train', 'heldout')",
                       name=op.f('ck_synthetic_sequences_split')),
    sa.CheckConstraint('temperature >= 0',
                       name=op.f('ck_synthetic_sequences_temperature_nonnegative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_synthetic_sequences'))
    )
    op.create_index(op.f('ix_synthetic_sequences_created_at'), 'synthetic_sequences',
                    ['created_at'])
    op.create_index('ix_synthetic_sequences_target_split', 'synthetic_sequences',
                    ['target_id', 'target_revision', 'dtype', 'split', 'created_at'])


def downgrade() -> None:
    op.drop_index('ix_synthetic_sequences_target_split', table_name='synthetic_sequences')
    op.drop_index(op.f('ix_synthetic_sequences_created_at'), table_name='synthetic_sequences')
    op.drop_table('synthetic_sequences')

"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30

The whole first schema: requests, training_runs, speculators, live_pointer, evaluations,
events, leases (see autospec/store/models.py for what each column means).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match


def upgrade() -> None:
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('deployment', sa.String(length=64), nullable=True),
    sa.Column('version', sa.String(length=64), nullable=True),
    sa.Column('from_version', sa.String(length=64), nullable=True),
    sa.Column('details', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    op.create_index(op.f('ix_events_created_at'), 'events', ['created_at'])
    op.create_index(op.f('ix_events_kind_created_at'), 'events', ['kind', 'created_at'])

    op.create_table('leases',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('token', sa.Integer(), nullable=False),
    sa.Column('acquired_at', sa.DateTime(), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_leases'))
    )
    op.create_table('requests',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('request_uid', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('deployment', sa.String(length=64), nullable=False),
    sa.Column('segment', sa.String(length=64), nullable=False),
    sa.Column('speculator_version', sa.String(length=64), nullable=True),
    sa.Column('opted_out', sa.Boolean(), nullable=False),
    sa.Column('redacted', sa.Boolean(), nullable=False),
    sa.Column('prompt_text', sa.Text(), nullable=True),
    sa.Column('output_text', sa.Text(), nullable=True),
    sa.Column('prompt_ids', sa.LargeBinary(), nullable=True),
    sa.Column('output_ids', sa.LargeBinary(), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('temperature', sa.Float(), nullable=False),
    sa.Column('sampling', sa.JSON(), nullable=True),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.Column('num_drafts', sa.Integer(), nullable=False),
    sa.Column('num_draft_tokens', sa.Integer(), nullable=False),
    sa.Column('num_accepted_tokens', sa.Integer(), nullable=False),
    sa.Column('accepted_per_position', sa.JSON(), nullable=True),
    sa.CheckConstraint('num_drafts >= 0 AND num_accepted_tokens >= 0', name=op.f('ck_requests_counts_nonneg')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_requests')),
    sa.UniqueConstraint('request_uid', name=op.f('uq_requests_request_uid'))
    )
    op.create_index(op.f('ix_requests_created_at'), 'requests', ['created_at'])
    op.create_index(op.f('ix_requests_segment_created_at'), 'requests', ['segment', 'created_at'])
    op.create_index(op.f('ix_requests_version_created_at'), 'requests', ['speculator_version', 'created_at'])

    op.create_table('training_runs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('parent_version', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('window_start', sa.DateTime(), nullable=True),
    sa.Column('window_end', sa.DateTime(), nullable=True),
    sa.Column('train_requests', sa.Integer(), nullable=False),
    sa.Column('heldout_requests', sa.Integer(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=True),
    sa.Column('version', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.CheckConstraint("status IN ('running', 'succeeded', 'failed')", name=op.f('ck_training_runs_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_runs'))
    )
    op.create_table('speculators',
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('parent', sa.String(length=64), nullable=True),
    sa.Column('target_id', sa.String(length=200), nullable=False),
    sa.Column('target_revision', sa.String(length=64), nullable=True),
    sa.Column('artifact_uri', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('draft_vocab_size', sa.Integer(), nullable=True),
    sa.Column('training_run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('meta', sa.JSON(), nullable=True),
    sa.CheckConstraint("state IN ('candidate', 'live', 'retired', 'rejected', 'rolled_back')", name=op.f('ck_speculators_state')),
    sa.ForeignKeyConstraint(['parent'], ['speculators.version'], name=op.f('fk_speculators_parent_speculators')),
    sa.ForeignKeyConstraint(['training_run_id'], ['training_runs.id'], name=op.f('fk_speculators_training_run_id_training_runs')),
    sa.PrimaryKeyConstraint('version', name=op.f('pk_speculators'))
    )
    op.create_index(op.f('ix_speculators_created_at'), 'speculators', ['created_at'])

    op.create_table('evaluations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('candidate', sa.String(length=64), nullable=False),
    sa.Column('incumbent', sa.String(length=64), nullable=True),
    sa.Column('training_run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('window_start', sa.DateTime(), nullable=True),
    sa.Column('window_end', sa.DateTime(), nullable=True),
    sa.Column('num_requests', sa.Integer(), nullable=False),
    sa.Column('tau_candidate', sa.Float(), nullable=True),
    sa.Column('tau_incumbent', sa.Float(), nullable=True),
    sa.Column('delta_ci_low', sa.Float(), nullable=True),
    sa.Column('delta_ci_high', sa.Float(), nullable=True),
    sa.Column('per_segment', sa.JSON(), nullable=True),
    sa.Column('decision', sa.String(length=16), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=True),
    sa.Column('policy', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['candidate'], ['speculators.version'], name=op.f('fk_evaluations_candidate_speculators')),
    sa.ForeignKeyConstraint(['incumbent'], ['speculators.version'], name=op.f('fk_evaluations_incumbent_speculators')),
    sa.ForeignKeyConstraint(['training_run_id'], ['training_runs.id'], name=op.f('fk_evaluations_training_run_id_training_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_evaluations'))
    )
    op.create_index(op.f('ix_evaluations_created_at'), 'evaluations', ['created_at'])

    op.create_table('live_pointer',
    sa.Column('deployment', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('previous_version', sa.String(length=64), nullable=True),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=128), nullable=False),
    sa.ForeignKeyConstraint(['previous_version'], ['speculators.version'], name=op.f('fk_live_pointer_previous_version_speculators')),
    sa.ForeignKeyConstraint(['version'], ['speculators.version'], name=op.f('fk_live_pointer_version_speculators')),
    sa.PrimaryKeyConstraint('deployment', name=op.f('pk_live_pointer'))
    )


def downgrade() -> None:
    op.drop_table('live_pointer')
    op.drop_table('evaluations')
    op.drop_table('speculators')
    op.drop_table('training_runs')
    op.drop_table('requests')
    op.drop_table('leases')
    op.drop_table('events')

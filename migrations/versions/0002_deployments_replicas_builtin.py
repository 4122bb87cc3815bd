"""deployments, replica reports, the built-in version registered

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-08

- ``deployments``: the target, revision and dtype a deployment's replicas serve (the one
  source of truth the controller, ``train`` and ``evaluate`` read);
- ``replica_reports``: what each replica actually serves, refreshed while it runs;
- the built-in version ``builtin-ngram`` registered (target-agnostic, no artifact: it is
  built in code), so the pointer always has somewhere to go back to and every promotion,
  the first one included, can be rolled back.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None
backward_compatible = False  # declared from 0007 on; before it the check needed an exact match

BUILTIN = 'builtin-ngram'


def upgrade() -> None:
    op.create_table('deployments',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('target', sa.Text(), nullable=False),
    sa.Column('target_id', sa.String(length=200), nullable=False),
    sa.Column('target_revision', sa.String(length=64), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_deployments'))
    )
    op.create_table('replica_reports',
    sa.Column('replica', sa.String(length=128), nullable=False),
    sa.Column('deployment', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('target_id', sa.String(length=200), nullable=False),
    sa.Column('target_revision', sa.String(length=64), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('reported_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('replica', name=op.f('pk_replica_reports'))
    )
    op.create_index(op.f('ix_replica_reports_deployment'), 'replica_reports', ['deployment'])
    _register_builtin()


def _register_builtin() -> None:
    """Insert the built-in version unless an earlier release registered it already."""
    conn = op.get_bind()
    found = conn.execute(sa.text('SELECT 1 FROM speculators WHERE version = :v'),
                         {'v': BUILTIN}).first()
    if found is not None:
        return
    speculators = sa.table(
        'speculators', sa.column('version', sa.String), sa.column('kind', sa.String),
        sa.column('target_id', sa.String), sa.column('artifact_uri', sa.Text),
        sa.column('sha256', sa.String), sa.column('created_at', sa.DateTime),
        sa.column('state', sa.String), sa.column('meta', sa.JSON))
    op.bulk_insert(speculators, [{
        'version': BUILTIN, 'kind': 'ngram', 'target_id': '*',
        'artifact_uri': 'builtin:ngram',
        'sha256': hashlib.sha256(b'builtin:ngram').hexdigest(),
        'created_at': datetime.now(timezone.utc).replace(tzinfo=None),
        'state': 'candidate', 'meta': {'builtin': True}}])


def downgrade() -> None:
    op.drop_index(op.f('ix_replica_reports_deployment'), table_name='replica_reports')
    op.drop_table('replica_reports')
    op.drop_table('deployments')

"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}
# True only when this migration just expands the schema (new table, nullable or defaulted
# column, index): the code of the previous revision keeps working against it, so replicas
# and the controller can be rolled after `autospec db upgrade` (ops/RUNBOOK.md, Upgrading).
# A contracting change (drop, rename, NOT NULL without default) is False, in a later release.
backward_compatible = False


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}

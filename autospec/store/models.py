"""Tables of the traffic store and speculator registry (SQLAlchemy 2 typed models).

The schema is created and changed only by Alembic migrations (the top-level ``migrations/``,
installed as ``autospec.migrations``);
``tests/store/test_migrations.py`` checks that these models and the migrations do not drift.

Conventions:

- every timestamp is UTC; :class:`UTCDateTime` stores it naive-UTC (portable across SQLite
  and PostgreSQL) and always hands back a timezone-aware ``datetime``;
- token ids are packed little-endian int32 (:func:`autospec.store.codec.pack_ids`) in a
  ``LargeBinary`` column: 4 bytes a token on both SQLite (BLOB) and PostgreSQL (BYTEA);
- accepted-per-position is a JSON list of ints: entry ``i`` counts the verification steps of
  the request in which draft position ``i`` was accepted;
- a request's acceptance length τ = (num_accepted_tokens + num_drafts) / num_drafts, the bonus
  token included (``num_drafts`` = verification steps).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BUILTIN_VERSION = "builtin-ngram"
"""The training-free n-gram version every store holds (registered by migration 0002, no
artifact): live until something is promoted."""
SPECULATOR_STATES = ("candidate", "live", "retired", "rejected", "rolled_back")
RUN_STATES = ("running", "succeeded", "failed")
EVENT_KINDS = (
    "registration",
    "promotion",
    "rollback",
    "override",
    "rejection",
    "failure",
    "purge",
    "lease",
    "note",
    "import",
    "swap",
    "policy",
    "unpin",
)
"""Event kinds :func:`autospec.store.registry.record_event` accepts (checked in Python, not by a
CHECK constraint, so adding a kind needs no migration)."""

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
BigID = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the only kind of time the store hands out)."""
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A UTC timestamp: stored naive-UTC, returned aware; naive inputs are taken as UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class Request(Base):
    """One served request: what was asked and answered (unless opted out) and how drafting went."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    request_uid: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    deployment: Mapped[str] = mapped_column(String(64), default="default")
    segment: Mapped[str] = mapped_column(String(64), default="default")
    speculator_version: Mapped[str | None] = mapped_column(String(64))
    opted_out: Mapped[bool] = mapped_column(Boolean, default=False)
    redacted: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_text: Mapped[str | None] = mapped_column(Text)
    output_text: Mapped[str | None] = mapped_column(Text)
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    output_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    temperature: Mapped[float] = mapped_column(Float, default=0.0)
    sampling: Mapped[dict[str, Any] | None]
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    num_drafts: Mapped[int] = mapped_column(Integer, default=0)
    num_draft_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_accepted_tokens: Mapped[int] = mapped_column(Integer, default=0)
    accepted_per_position: Mapped[list[Any] | None]

    __table_args__ = (
        Index("ix_requests_version_created_at", "speculator_version", "created_at"),
        Index("ix_requests_segment_created_at", "segment", "created_at"),
        CheckConstraint("num_drafts >= 0 AND num_accepted_tokens >= 0", name="counts_nonneg"),
    )


class TrainingRun(Base):
    """One attempt to train a candidate: its data window, config, outcome."""

    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    parent_version: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    window_start: Mapped[datetime | None]
    window_end: Mapped[datetime | None]
    train_requests: Mapped[int] = mapped_column(Integer, default=0)
    heldout_requests: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[dict[str, Any] | None]
    metrics: Mapped[dict[str, Any] | None]
    version: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (CheckConstraint(_in("status", RUN_STATES), name="status"),)


class Speculator(Base):
    """A registered speculator version and where its checked artifact lives."""

    __tablename__ = "speculators"

    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    parent: Mapped[str | None] = mapped_column(ForeignKey("speculators.version"))
    target_id: Mapped[str] = mapped_column(String(200))
    target_revision: Mapped[str | None] = mapped_column(String(64))
    artifact_uri: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    draft_vocab_size: Mapped[int | None] = mapped_column(Integer)
    training_run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id"))
    created_at: Mapped[datetime] = mapped_column(index=True)
    state: Mapped[str] = mapped_column(String(16), default="candidate")
    meta: Mapped[dict[str, Any] | None]

    __table_args__ = (CheckConstraint(_in("state", SPECULATOR_STATES), name="state"),)


class LivePointer(Base):
    """Which version a deployment serves; ``generation`` grows by one on every move."""

    __tablename__ = "live_pointer"

    deployment: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(ForeignKey("speculators.version"))
    previous_version: Mapped[str | None] = mapped_column(ForeignKey("speculators.version"))
    generation: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(128))


class SegmentPointer(Base):
    """Which version serves one segment of a deployment (a request's ``x-autospec-segment`` or
    the segment a deployment's rule gives it); a segment without a row is served by the
    deployment's :class:`LivePointer`. ``generation`` grows by one on every move."""

    __tablename__ = "segment_pointers"

    deployment: Mapped[str] = mapped_column(String(64), primary_key=True)
    segment: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(ForeignKey("speculators.version"))
    previous_version: Mapped[str | None] = mapped_column(ForeignKey("speculators.version"))
    generation: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(128))


class Deployment(Base):
    """What a deployment serves: its target, the numerics its replicas run it in, the
    engine they decode with and on how many CPU threads.

    Written by every replica when it starts (the newest replica's view wins); the controller,
    ``train`` and ``evaluate`` read it, so candidates are trained and shadow-evaluated for
    exactly the target and dtype the replicas serve.
    """

    __tablename__ = "deployments"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    target: Mapped[str] = mapped_column(Text)  # the spec the replicas load (name, dir, .gguf)
    target_id: Mapped[str] = mapped_column(String(200))
    target_revision: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))  # resolved: "float32" or "bfloat16"
    engine: Mapped[str] = mapped_column(String(16), server_default="native")  # or "vllm"
    # torch's CPU threads a replica decodes with (None: a GPU replica, or a row written
    # before revision 0005); the controller measures speed on as many
    threads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # draft tokens per concurrency band set by the controller's policy (serving.k_bands),
    # which the replicas follow; None: their own serve config's (revision 0006)
    k_bands: Mapped[str | None] = mapped_column(String(200), nullable=True)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(128))


class ReplicaReport(Base):
    """One serving replica's latest report: the version it actually serves, and when."""

    __tablename__ = "replica_reports"

    replica: Mapped[str] = mapped_column(String(128), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[str] = mapped_column(String(64))
    target_id: Mapped[str] = mapped_column(String(200))
    target_revision: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime]
    reported_at: Mapped[datetime]


class Evaluation(Base):
    """A shadow evaluation of a candidate against the incumbent on the same held-out traffic."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    #: the deployment whose traffic it replayed (None: recorded before revision 0009)
    deployment: Mapped[str | None] = mapped_column(String(64), index=True)
    candidate: Mapped[str] = mapped_column(ForeignKey("speculators.version"))
    incumbent: Mapped[str | None] = mapped_column(ForeignKey("speculators.version"))
    training_run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id"))
    window_start: Mapped[datetime | None]
    window_end: Mapped[datetime | None]
    num_requests: Mapped[int] = mapped_column(Integer, default=0)
    tau_candidate: Mapped[float | None] = mapped_column(Float)
    tau_incumbent: Mapped[float | None] = mapped_column(Float)
    delta_ci_low: Mapped[float | None] = mapped_column(Float)
    delta_ci_high: Mapped[float | None] = mapped_column(Float)
    per_segment: Mapped[dict[str, Any] | None]
    decision: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list[Any] | None]
    policy: Mapped[dict[str, Any] | None]


SYNTHETIC_SPLITS = ("train", "heldout")


class SyntheticSequence(Base):
    """A sequence the target generated for training (``autospec synth``), never traffic.

    Kept out of ``requests`` so no traffic query (windows, live τ, counts, held-out sets) can
    ever see it. ``source`` is ``resampled`` (a logged prompt answered again at temperature
    > 0; ``origin_request_id`` names it) or ``domain:<name>`` (a prompt of a workload
    domain). ``split`` is ``train`` (mixed into training windows) or ``heldout`` (only for
    the overfitting guard's synthetic τ, never trained on). Only rows of the target id,
    revision and dtype being trained are used.
    """

    __tablename__ = "synthetic_sequences"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    run_id: Mapped[str] = mapped_column(String(32))  # one ``autospec synth`` run
    source: Mapped[str] = mapped_column(String(64))
    split: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(String(200))
    target_revision: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)
    output_ids: Mapped[bytes] = mapped_column(LargeBinary)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float] = mapped_column(Float)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    origin_request_id: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_synthetic_sequences_target_split", "target_id", "target_revision", "dtype",
              "split", "created_at"),
        CheckConstraint(_in("split", SYNTHETIC_SPLITS), name="split"),
        CheckConstraint("temperature >= 0", name="temperature_nonnegative"),
    )


class Event(Base):
    """The audit log: every pointer move, override and failure, with who and why."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    kind: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    deployment: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[str | None] = mapped_column(String(64))
    from_version: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any] | None]

    __table_args__ = (Index("ix_events_kind_created_at", "kind", "created_at"),)


class Lease(Base):
    """A named single-flight lease (e.g. the controller cycle); ``token`` fences stale holders."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(Integer, default=1)
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class SchemaCompat(Base):
    """One row: the migration revision the schema is at and ``min_reader``, the oldest
    autospec code (by its head revision) that can still run against it.

    Written by every migration run (:func:`autospec.store.migrate.record_compat`) from the
    migrations' ``backward_compatible`` marks; read by :func:`~autospec.store.migrate.check_schema`
    when the database is at a revision newer than the code knows (expand-then-contract).
    Schema bookkeeping, not data: backups leave it out.
    """

    __tablename__ = "autospec_schema"

    revision: Mapped[str] = mapped_column(String(32), primary_key=True)
    min_reader: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[datetime]


metadata = Base.metadata

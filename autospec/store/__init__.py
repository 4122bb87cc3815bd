"""The traffic store and speculator registry: one SQL database (SQLite file or PostgreSQL).

Knows nothing of torch, models or HTTP. Typical use::

    from autospec import store

    engine = store.open_store()                      # AUTOSPEC_DATABASE_URL, schema checked
    writer = store.TrafficWriter(engine)             # serving path: record() only enqueues
    writer.record(prompt_ids=..., output_ids=..., num_drafts=..., ...)

    with store.session_scope(engine) as session:     # one transaction
        store.register_speculator(session, version=..., kind="eagle3", ...)
        store.set_live(session, version=..., actor="controller", reason="gate passed")

Modules: :mod:`~autospec.store.db` (engines, sessions, SQLite WAL set-up),
:mod:`~autospec.store.migrate` (Alembic from code), :mod:`~autospec.store.models` (tables),
:mod:`~autospec.store.writer` (traffic writer), :mod:`~autospec.store.traffic` (request rows),
:mod:`~autospec.store.privacy` (opt-out, redaction), :mod:`~autospec.store.registry`
(speculators, audit log), :mod:`~autospec.store.pointers` (live pointers),
:mod:`~autospec.store.leases`,
:mod:`~autospec.store.deployments` (what a deployment serves, replica reports),
:mod:`~autospec.store.queries` (windows, τ, counts, purge), :mod:`~autospec.store.load`
(the concurrency served), :mod:`~autospec.store.history`
(training runs, evaluations), :mod:`~autospec.store.artifacts` (artifact SHA-256),
:mod:`~autospec.store.synthetic` (target-generated training sequences, apart from traffic),
:mod:`~autospec.store.backup` (portable backup and restore of the rows and artifacts),
:mod:`~autospec.store.errors`.
"""

from autospec.store.artifacts import artifact_sha256, write_manifest
from autospec.store.db import make_engine, ping, session_scope
from autospec.store.deployments import (
    deployment_known,
    fresh_reports_since,
    get_deployment,
    known_deployments,
    list_replicas,
    record_deployment,
    remove_replica,
    report_replica,
    set_k_bands,
)
from autospec.store.errors import (
    ArtifactError,
    BadDatabaseURL,
    Conflict,
    DatabaseUnreachable,
    NotFound,
    SchemaError,
    SchemaNotInitialized,
    SchemaOutdated,
    StoreError,
    UnknownRevision,
)
from autospec.store.history import (
    finish_training_run,
    get_training_run,
    list_evaluations,
    list_training_runs,
    record_evaluation,
    start_training_run,
)
from autospec.store.leases import LeaseGrant, acquire_lease, get_lease, release_lease, renew_lease
from autospec.store.load import ConcurrencyProfile, served_concurrency
from autospec.store.migrate import (
    check_schema,
    current_revision,
    head_revision,
    open_store,
    upgrade,
)
from autospec.store.pointers import (
    clear_segment,
    get_live,
    list_segment_pointers,
    pointers_by_version,
    rollback,
    serving_version,
    set_live,
)
from autospec.store.privacy import no_redaction, redact_default
from autospec.store.queries import (
    TauStat,
    TrafficExample,
    TrafficWindow,
    live_tau,
    purge_requests,
    request_counts,
    traffic_window,
)
from autospec.store.registry import (
    check_actor,
    get_speculator,
    list_events,
    list_speculators,
    next_version,
    record_event,
    register_speculator,
    registered_with,
    set_state,
)
from autospec.store.synthetic import (
    SyntheticExample,
    SyntheticRecord,
    SyntheticTarget,
    add_synthetic,
    count_synthetic,
    select_synthetic,
)
from autospec.store.traffic import RequestRecord, write_requests
from autospec.store.writer import TrafficWriter, WriterCounters, register_prometheus

__all__ = [
    "ArtifactError",
    "BadDatabaseURL",
    "ConcurrencyProfile",
    "Conflict",
    "DatabaseUnreachable",
    "LeaseGrant",
    "NotFound",
    "RequestRecord",
    "SchemaError",
    "SchemaNotInitialized",
    "SchemaOutdated",
    "StoreError",
    "SyntheticExample",
    "SyntheticRecord",
    "SyntheticTarget",
    "TauStat",
    "TrafficExample",
    "TrafficWindow",
    "TrafficWriter",
    "UnknownRevision",
    "WriterCounters",
    "acquire_lease",
    "add_synthetic",
    "artifact_sha256",
    "check_actor",
    "check_schema",
    "clear_segment",
    "count_synthetic",
    "current_revision",
    "deployment_known",
    "finish_training_run",
    "fresh_reports_since",
    "get_deployment",
    "get_lease",
    "get_live",
    "get_speculator",
    "get_training_run",
    "head_revision",
    "known_deployments",
    "list_evaluations",
    "list_events",
    "list_replicas",
    "list_segment_pointers",
    "list_speculators",
    "list_training_runs",
    "live_tau",
    "make_engine",
    "next_version",
    "no_redaction",
    "open_store",
    "ping",
    "pointers_by_version",
    "purge_requests",
    "record_deployment",
    "record_evaluation",
    "record_event",
    "redact_default",
    "register_prometheus",
    "register_speculator",
    "registered_with",
    "release_lease",
    "remove_replica",
    "renew_lease",
    "report_replica",
    "request_counts",
    "rollback",
    "select_synthetic",
    "served_concurrency",
    "serving_version",
    "session_scope",
    "set_k_bands",
    "set_live",
    "set_state",
    "start_training_run",
    "traffic_window",
    "upgrade",
    "write_manifest",
    "write_requests",
]

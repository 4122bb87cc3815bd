"""Which speculator version a replica serves, and the hot-swap when the live pointer moves.

A :class:`ServedVersion` is immutable: a version name and the
:class:`~autospec.engine.interface.Engine` that decodes with it (on the native engine one
:class:`~autospec.engine.generate.SpeculativeEngine` per version, all sharing the replica's
one target; on vLLM, :mod:`autospec.serve.vllm_versions`). A request reads
:attr:`VersionManager.current` once when it starts and decodes with that engine to the end,
so a response never mixes versions. A swap is one reference assignment, made only after the
new version has loaded completely.

:class:`VersionManager` watches the live pointer of its deployment (a read-only query every
``poll_interval_s``, in a background thread, never on the request path). When the pointer
names another version it loads that version's artifact (``artifact_uri``, a directory
checked by :func:`~autospec.speculators.checkpoint.load_speculator`) and swaps. A version
that fails to load (checksum, shape, missing file, unknown version) leaves the replica on its
current version; the failure is logged, recorded once in the audit log (event kind
``failure``) and not retried until the pointer moves again.

The artifact's SHA-256 must be the one registered: an artifact directory whose files were
replaced by another (valid) artifact's is refused and audited like any other load failure.

**Reports.** While it follows the pointer, the manager keeps one row of the store's
``replica_reports`` current for its replica (the version it serves, target, revision, dtype),
refreshed every ``report_interval_s`` and at once after a swap, and removed at
:meth:`VersionManager.stop`; ``autospec status`` shows these next to the pointer.

A pointer moved back to ``builtin-ngram`` serves the built-in speculator again (version
names resolve through :mod:`autospec.versions`, as evaluation resolves them).
With no live pointer yet the replica serves the training-free n-gram speculator under the
version name :data:`~autospec.serve.config.BUILTIN_VERSION` (``builtin-ngram``); with
speculation off it serves target-only decoding as :data:`~autospec.serve.config.OFF_VERSION`.
If the pointer is removed the replica keeps serving what it has.

**Segments.** With the pointer the watcher reads the deployment's segment pointers
(``autospec promote VERSION --segment S``) and holds one loaded version per version they
name (a version named by several segments, or by the deployment too, is loaded once; one no
pointer names any more is freed). A request drafts with its segment's version
(:meth:`VersionManager.for_segment`; the segment is resolved once per request,
:mod:`autospec.serve.segments`), else with :attr:`~VersionManager.current`. A segment's
version that fails to load is refused and audited as the deployment's is (event
``failure``, ``details.segment``); its segment is drafted by the deployment's version
meanwhile. The replica report names the deployment's version; the segments' are in
``/health`` (``segments``: segment -> version, ``segment_versions``: name -> speculator
bytes) and in the log.

**Memory.** :data:`TRIM_AFTER_S` after a swap (or a segment's version freed) the watcher
hands the freed heap back to the OS (:func:`autospec.memory.release_freed_memory`):
without it glibc keeps the old version's pages and the replica's resident set steps up at
each swap (the soak's "+75 MiB per eagle3 swap", docs/soak.md).

**Bands.** With the pointer the watcher reads the deployment's concurrency bands
(``deployments.k_bands``, set by the controller from its policy's ``serving.k_bands``,
:mod:`autospec.serve.bands`): :attr:`VersionManager.policy_bands`, which the server drafts by
instead of its own config's when set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.interface import Engine as DecodingEngine
from autospec.engine.target import Target
from autospec.memory import release_freed_memory
from autospec.serve.bands import MAX_K, BandsError, KBands, parse_bands
from autospec.serve.config import BUILTIN_VERSION, OFF_VERSION
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.registry import new_speculator
from autospec.store.models import utcnow
from autospec.versions import VersionLoadError, load_speculator_version

log = logging.getLogger(__name__)

TRIM_AFTER_S = 30.0
"""Seconds after a swap before freed memory is handed back: long enough for requests that
started on the old version to end (a swap never waits for them)."""


@dataclass(frozen=True)
class ServedVersion:
    """A speculator version ready to serve: its name and the engine that decodes with it."""

    name: str
    kind: str  # a kind of autospec.speculators.registry.KINDS, or "none" for target-only
    engine: DecodingEngine
    loaded_at: float = field(default_factory=time.time)
    #: on vLLM, a segment's version held beside the deployment's in the same engine: the
    #: slot of autospec's proposer its requests name (None: the engine's own drafter)
    slot: str | None = None


def builtin_version(target: Target, k: int) -> ServedVersion:
    """The training-free n-gram speculator, served when no version is live yet."""
    engine = SpeculativeEngine(target, new_speculator("ngram", target), k,
                               version=BUILTIN_VERSION)
    return ServedVersion(BUILTIN_VERSION, "ngram", engine)


def off_version(target: Target) -> ServedVersion:
    """Target-only decoding (speculation off)."""
    return ServedVersion(OFF_VERSION, "none", SpeculativeEngine(target, None,
                                                                version=OFF_VERSION))


def load_version(db: Engine | None, target: Target, version: str, k: int, *,
                 actor: str = "serve", deployment: str | None = None) -> ServedVersion:
    """``version`` ready to serve (the shared resolver of :mod:`autospec.versions`: the
    built-in name, or a registered artifact); :class:`VersionLoadError` if refused."""
    kind, speculator = load_speculator_version(db, target, version, actor=actor,
                                               deployment=deployment)
    return ServedVersion(version, kind, SpeculativeEngine(target, speculator, k,
                                                          version=version))


class VersionManager:
    """Holds the replica's current version and follows the live pointer (see module doc)."""

    def __init__(self, *, target: Target, db: Engine | None, deployment: str = "default",
                 k: int = 5, speculation: bool = True, poll_interval_s: float = 1.0,
                 report_interval_s: float = 10.0, actor: str = "serve",
                 on_swap: Callable[[ServedVersion, ServedVersion], None] | None = None,
                 on_failure: Callable[[str, str], None] | None = None,
                 bands: KBands | None = None) -> None:
        self.target, self.db, self.deployment, self.k = target, db, deployment, k
        self.poll_interval_s, self.actor = poll_interval_s, actor
        self.report_interval_s = report_interval_s
        self.follows_pointer = speculation and db is not None
        self.started_at = utcnow()
        self._reported = 0.0  # monotonic time of the last report
        self.on_swap, self.on_failure = on_swap, on_failure
        self._current = self._initial(speculation)
        self._failed: tuple[str, int] | None = None  # (version, generation) that failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_poll_error: str | None = None
        self.load_failures = 0
        #: the replica's own concurrency bands (its serve config's; None: none)
        self.bands = bands
        #: the concurrency bands the controller's policy set for the deployment (None: none;
        #: the replica's own then), read with the pointer
        self.policy_bands: KBands | None = None
        self._bad_bands: str | None = None  # bands text refused (not logged again)
        #: segment -> the version loaded for its pointer (replaced whole, never mutated)
        self._by_segment: dict[str, ServedVersion] = {}
        self._segments_wanted: dict[str, tuple[str, int]] = {}  # as last read
        self._segment_failed: dict[str, tuple[str, int]] = {}  # refused (no retry)
        self._trim_due: float | None = None  # monotonic time to return freed memory
        self._sizes: dict[str, int | None] = {}  # version -> speculator bytes, counted
        self._target_only: ServedVersion | None = None  # the holdout's (target_only)

    def _initial(self, speculation: bool) -> ServedVersion | None:
        """What the replica serves before (or without) following the pointer (None: nothing
        until :meth:`start`, as an engine that takes long to start does)."""
        return builtin_version(self.target, self.k) if speculation else off_version(self.target)

    def _load(self, version: str) -> ServedVersion:
        """``version`` ready to serve; :class:`VersionLoadError` if refused."""
        return load_version(self.db, self.target, version, self.k, actor=self.actor,
                            deployment=self.deployment)

    @property
    def current(self) -> ServedVersion:
        """The version new requests start on (read it once per request)."""
        if self._current is None:
            raise RuntimeError("no version is loaded yet: start() loads the first")
        return self._current

    def for_segment(self, segment: str | None) -> ServedVersion:
        """The version that drafts ``segment``'s requests: its segment pointer's, loaded,
        else :attr:`current` (read it once per request)."""
        held = self._by_segment.get(segment) if segment is not None else None
        return held if held is not None else self.current

    @property
    def target_only(self) -> ServedVersion:
        """Speculation off, for the requests the replica holds out (autospec/serve/holdout.py):
        made on first use, sharing the target."""
        if self._target_only is None:
            self._target_only = off_version(self.target)
        return self._target_only

    @property
    def segments(self) -> dict[str, str]:
        """Segment -> the version drafting it, for the segments with a version of their own."""
        return {segment: v.name for segment, v in sorted(self._by_segment.items())}

    def holds(self, engine: DecodingEngine) -> bool:
        """True if a segment still drafts with ``engine`` (a swap must not retire it)."""
        return any(v.engine is engine for v in self._by_segment.values())

    def segment_memory(self) -> dict[str, int | None]:
        """Each version held for segments: the bytes of its speculator's tensors (None:
        not a tensor speculator)."""
        sizes = self._sizes
        for v in self._by_segment.values():
            if v.name not in sizes:  # counted once per version: /health asks often
                sizes[v.name] = speculator_bytes(v)
        return {v.name: sizes[v.name] for v in self._by_segment.values()}

    def start(self) -> None:
        """Load the live version now (blocking), report it, then follow the pointer (and
        keep the report fresh) in a thread."""
        if not self.follows_pointer:  # speculation off (or no store): nothing to follow
            return
        self.poll_once()
        self.report()
        self._thread = threading.Thread(target=self._run, name="autospec-live-pointer",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.follows_pointer:
            try:
                with store.session_scope(self.db) as session:
                    store.remove_replica(session, replica=self.actor)
            except Exception:  # shutting down: a stale report ages out of `status`
                log.warning("could not remove the report of replica %s", self.actor)

    def report(self) -> None:
        """Record what this replica serves now (best effort: serving never waits on it)."""
        assert self.db is not None
        info, cur = self.target.info, self.current
        try:
            with store.session_scope(self.db) as session:
                store.report_replica(session, replica=self.actor, deployment=self.deployment,
                                     version=cur.name, target_id=info.target_id,
                                     target_revision=info.revision,
                                     dtype=self.target.dtype_name, started_at=self.started_at)
            self._reported = time.monotonic()
        except Exception as exc:  # database down: keep serving, report again later
            log.warning("cannot report replica %s: %s", self.actor, exc)

    @property
    def watching(self) -> bool:
        """True while the watcher runs (or when there is nothing to watch)."""
        return not self.follows_pointer or (self._thread is not None and self._thread.is_alive())

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.poll_once()
                if time.monotonic() - self._reported >= self.report_interval_s:
                    self.report()
                self._trim_if_due()
            except Exception:  # the watcher must outlive any one bad poll
                log.exception("live-pointer poll failed; will retry")

    def _trim_if_due(self) -> None:
        """A while after a swap (the old version's last requests ended, its engine closed),
        give its freed memory back (:mod:`autospec.memory`)."""
        if self._trim_due is not None and time.monotonic() >= self._trim_due:
            self._trim_due = None
            release_freed_memory()

    def poll_once(self) -> bool:
        """Read the pointers; load and swap if the deployment's names another version, and
        follow the segments' (:meth:`_follow_segments`). True if the deployment's swapped."""
        assert self.db is not None
        try:
            with store.session_scope(self.db, readonly=True) as session:
                pointer = store.get_live(session, deployment=self.deployment)
                wanted = (pointer.version, pointer.generation) if pointer else None
                row = store.get_deployment(session, name=self.deployment)
                bands = row.k_bands if row is not None else None
                segments = {p.segment: (p.version, p.generation) for p in
                            store.list_segment_pointers(session, deployment=self.deployment)}
        except store.StoreError as exc:  # database down: keep serving what we have
            self._note_poll_error(str(exc))
            return False
        except Exception as exc:  # SQLAlchemy errors not wrapped by the store
            self._note_poll_error(f"{type(exc).__name__}: {exc}")
            return False
        self.last_poll_error = None
        if bands != (str(self.policy_bands) if self.policy_bands else None) and \
                (bands is None or bands != self._bad_bands):
            self._follow_bands(bands, wanted)
        swapped = False
        if wanted is not None and wanted[0] != self.current.name and wanted != self._failed:
            swapped = self._swap_to(*wanted)
        if segments != self._segments_wanted:
            self._follow_segments(segments)
        return swapped

    def _follow_segments(self, wanted: dict[str, tuple[str, int]]) -> None:
        """Hold one loaded version per version the segment pointers name (reusing those
        loaded, the deployment's included), then free those no pointer names any more. A
        segment whose pointer is gone is drafted by the deployment's version before any
        load: a load can take long (on vLLM a slot's waits up to its timeout)."""
        loaded, old = self._segment_reusable(), self._by_segment
        self._by_segment = {s: v for s, v in old.items() if s in wanted}  # the unpinned
        held: dict[str, ServedVersion] = {}
        done = False
        try:
            for segment, (version, generation) in sorted(wanted.items()):
                if version not in loaded and self._segment_failed.get(segment) != (
                        version, generation):
                    try:
                        loaded[version] = self._load_for_segment(version)
                        log.info("segment %s: loaded %s", segment, version)
                    except VersionLoadError as exc:
                        self._refused(version, generation, exc, segment=segment)
                if version in loaded:
                    held[segment] = loaded[version]
            done = True
        finally:  # a load that raised (the store down) still frees the unpinned's versions;
            # the pointers are read again at the next poll
            self._by_segment = held if done else {**self._by_segment, **held}
            if done:
                self._segments_wanted = dict(wanted)
            self._free_segment_versions(old)
        log.info("drafting by segment: %s (others: %s)",
                 ", ".join(f"{s}={v}" for s, v in self.segments.items()) or "none",
                 self.current.name)

    def _segment_reusable(self) -> dict[str, ServedVersion]:
        """The versions a segment pointer can name without a load: those held, and the
        deployment's."""
        return {v.name: v for v in (*self._by_segment.values(), self.current)}

    def _load_for_segment(self, version: str) -> ServedVersion:
        """``version`` ready to draft a segment; :class:`VersionLoadError` if refused."""
        return self._load(version)

    def _free_segment_versions(self, old: dict[str, ServedVersion]) -> None:
        """Free the versions of ``old`` (segment -> version, before the pointers were
        followed) that neither a segment nor the deployment drafts with now."""
        for version in {id(v): v for v in old.values()}.values():
            if version.engine is not self.current.engine and not self.holds(version.engine):
                version.engine.retire()  # it closes once its running requests have ended
                log.info("freed %s: no segment pointer names it any more", version.name)
                self._trim_due = time.monotonic() + TRIM_AFTER_S

    @property
    def serving_bands(self) -> KBands | None:
        """The bands requests draft by now: the policy's if it set any, else the replica's."""
        return self.policy_bands or self.bands

    def _follow_bands(self, text: str | None, wanted: tuple[str, int] | None) -> None:
        """The policy's bands changed: requests starting from now draft by them (an engine
        that fixes its bands at start reloads, see the vLLM manager)."""
        self._read_bands(text)

    def _read_bands(self, text: str | None) -> bool:
        """Take the policy's bands ``text`` (None: none); False, and said once, if unusable."""
        try:
            self.policy_bands = parse_bands(text, max_k=MAX_K)
        except BandsError as exc:  # written by a newer controller? keep what we have
            log.error("ignoring the deployment's concurrency bands %r: %s", text, exc)
            self._bad_bands = text
            return False
        log.info("drafting by the policy's concurrency bands: %s", text or "the replica's own")
        return True

    def _note_poll_error(self, message: str) -> None:
        if message != self.last_poll_error:
            log.warning("cannot read the live pointer of %r: %s", self.deployment, message)
        self.last_poll_error = message

    def _held(self, version: str) -> ServedVersion | None:
        """``version`` as a segment holds it, to serve the deployment too (None: not held)."""
        return next((v for v in self._by_segment.values() if v.name == version), None)

    def _swap_to(self, version: str, generation: int, *,
                 details: dict[str, Any] | None = None, pointer: bool = True) -> bool:
        """Load ``version`` and serve it; False if refused (audited with ``details``).
        ``pointer``: the swap follows the deployment's pointer, whose failed version it
        remembers (else a restart of the version served: the record is left as it is)."""
        started = time.perf_counter()
        try:
            new = self._held(version) or self._load(version)
        except VersionLoadError as exc:
            self._refused(version, generation, exc, details=details, remember=pointer)
            return False
        old, self._current = self.current, new  # the swap: one reference assignment
        if pointer:
            self._failed = None
        log.info("now serving %s (was %s; loaded in %.2fs)", new.name, old.name,
                 time.perf_counter() - started)
        self.report()
        if self.on_swap is not None:
            self.on_swap(old, new)
        self._trim_due = time.monotonic() + TRIM_AFTER_S
        return True

    def _refused(self, version: str, generation: int, exc: VersionLoadError, *,
                 segment: str | None = None, details: dict[str, Any] | None = None,
                 remember: bool = True) -> None:
        """``version`` failed to load (for ``segment``'s pointer, or the deployment's):
        remember it (no retry until that pointer moves; not where ``remember`` is False),
        log it, audit it (``details`` added to the event's)."""
        staying = self._current.name if self._current else None
        if segment is None:
            if remember:
                self._failed = (version, generation)
            log.error("staying on %s: %s", staying, exc)
        else:
            self._segment_failed[segment] = (version, generation)
            log.error("segment %s is drafted by the deployment's %s: %s", segment, staying, exc)
        self.load_failures += 1
        if not exc.audited:
            self._record_failure(version, str(exc), segment, details)
        if self.on_failure is not None:
            self.on_failure(version, str(exc))

    def _record_failure(self, version: str, reason: str, segment: str | None = None,
                        extra: dict[str, Any] | None = None) -> None:
        details: dict[str, Any] = {"what": "speculator load", "replica": self.actor,
                                   **(extra or {})}
        if segment is not None:
            details["segment"] = segment
        try:
            with store.session_scope(self.db) as session:
                store.record_event(session, kind="failure", actor=self.actor, reason=reason,
                                   deployment=self.deployment, version=version,
                                   from_version=self._current.name if self._current else None,
                                   details=details)
        except Exception:  # the audit log is best effort here; the replica keeps serving
            log.exception("could not record the load failure of %s", version)


def speculator_bytes(version: ServedVersion) -> int | None:
    """The bytes of ``version``'s speculator tensors on a native engine (None: none to
    count, e.g. on vLLM, with speculation off, or a speculator without tensors)."""
    speculator = getattr(version.engine, "speculator", None)
    if not isinstance(speculator, SavableSpeculator):
        return None
    return tensor_bytes(speculator.state_tensors())


def tensor_bytes(tensors: dict[str, Any]) -> int | None:
    """The bytes ``tensors`` take; None when there are none (the n-gram speculator's)."""
    return sum(t.numel() * t.element_size() for t in tensors.values()) if tensors else None

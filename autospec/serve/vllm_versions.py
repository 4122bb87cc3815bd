"""The versions of a vLLM replica: :class:`VllmVersionManager`, whose versions are
:class:`~autospec.engine.vllm.engine.VllmEngine` engines.

A version is loaded as everywhere (:func:`autospec.versions.load_speculator_version`,
checksums and registration checked), refused if vLLM cannot run it faithfully
(:func:`~autospec.speculators.registry.vllm_refusal`), and exported with
:func:`~autospec.interop.export.export_speculator` into a fresh directory under ``<data
dir>/vllm-exports/<host>-<pid>/`` (the replica's own: :mod:`autospec.serve.export_dirs`).
``builtin-ngram`` is vLLM's ``ngram`` method (prompt lookup with autospec's n-gram bounds);
a ``suffix`` version is autospec's custom proposer (:mod:`autospec.interop.vllm_proposer`),
its index loaded into the engine once it has started; with speculation off the engine has
no speculative config (version name ``off``).

**Hot swap, in place.** When the live pointer moves, the watcher thread exports the new
version and, when it fits the running engine (same vLLM method and k; for a draft model the
same config and tensor shapes: :mod:`autospec.engine.vllm.swap`), loads it into that engine
between two of its steps (new draft weights or a new suffix index, through vLLM's
``collective_rpc`` and autospec's worker extension): no second engine, no second copy of
the target, well under a second on a CPU. Requests in flight keep decoding; the steps after
the load draft with the new version, and a request drafted by both is named with both (the
response's ``drafted_by`` in the ``autospec`` object and its traffic row's
``sampling.drafted_by``). Rollback is the same move.

**Hot swap, side by side** — only when the new version does not fit (another kind, ``k`` or
shape): its engine starts beside the running one (two engines' memory meanwhile), then the
reference moves: requests admitted from then on go to the new engine, those already running
finish on the old one, which the server retires (it shuts down when its last request ends).
Every swap is audited (event ``swap``: ``in-place`` or ``new engine`` and why). A version
that fails (refused kind, load error, vLLM failing to start) leaves the replica serving what
it had and is audited once (``failure`` event), exactly as on the native path.

**Segments.** One engine has one drafter, so a segment's version of its own
(``autospec promote VERSION --segment S``) is held where that drafter can hold several: in
autospec's proposer, which keeps an index per segment version beside the deployment's
(:mod:`autospec.interop.vllm_proposer`, a *slot* named after the version). A segment's
suffix version is exported and loaded into a slot of the running engine (no second engine);
its requests name the slot in their sampling parameters and are drafted from it, their rows
and responses named after it. A slot no segment pointer names any more is dropped (requests
drafting from it keep it to their end). A segment version of another kind, or any while the
deployment's version is not a suffix version (its engine has no autospec proposer), is
refused like a failed load (audited ``failure``, ``details.segment``): its segment is
drafted by the deployment's version, and the controller does not set such pointers on a
vLLM deployment (:func:`autospec.controller.segment_watch.vllm_segment_refusal`). When the
deployment's version moves to an engine of its own (another kind), the slots stay with the
old engine for its last requests and are loaded into the new one at the next poll.

:func:`~autospec.speculators.registry.vllm_refusal` says why a version cannot be served on
vLLM, as its kind declares it (e.g. an ``eagle3`` version that drafts trees or consults its
traffic suffix index, which vLLM would silently run as plain chains of the head).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from autospec import store
from autospec.engine.interface import Engine
from autospec.engine.vllm.engine import RPC_TIMEOUT_S, VllmEngine
from autospec.engine.vllm.swap import (
    DraftShape,
    draft_shape,
    drop_slot,
    in_place_refusal,
    load_in_place,
    load_slot,
)
from autospec.interop.export import export_speculator, target_dir
from autospec.serve.bands import KBands, vllm_bands_refusal, vllm_schedule
from autospec.serve.config import BUILTIN_VERSION, OFF_VERSION, ServeConfig
from autospec.serve.export_dirs import replica_export_root
from autospec.serve.versions import ServedVersion, VersionManager, tensor_bytes
from autospec.settings import get_settings
from autospec.speculators.registry import vllm_per_request, vllm_refusal, vllm_seeded
from autospec.versions import VersionLoadError, load_speculator_version

log = logging.getLogger(__name__)

#: vLLM's max_model_len unless ``vllm_options`` sets it (bounded by the target's context)
DEFAULT_MAX_MODEL_LEN = 2048
#: seconds before a failed restart for new concurrency bands is tried again; doubled after
#: each failure, up to :data:`BANDS_RETRY_MAX_S` (each failure is one audited event)
BANDS_RETRY_S = 10.0
BANDS_RETRY_MAX_S = 600.0


@dataclass(frozen=True)
class _BandsRetry:
    """A restart for new bands that failed: the pointer's generation, failures so far and
    the monotonic time of the next try."""

    generation: int
    failures: int
    due: float


class VllmVersionManager(VersionManager):
    """:class:`VersionManager` whose versions are vLLM engines (see the module doc)."""

    def __init__(self, *, config: ServeConfig, **kwargs: Any) -> None:
        self.config = config
        self._speculation = bool(kwargs.get("speculation", True))
        #: new bands read this poll: the pointer's generation to restart with (None: none)
        self._bands_generation: int | None = None
        self._bands_retry: _BandsRetry | None = None  # a failed restart for them, to retry
        super().__init__(**{"bands": config.bands, **kwargs})
        options = dict(config.vllm_options)
        limit = self.target.info.max_position_embeddings
        self.max_model_len = min(int(options.pop("max_model_len", DEFAULT_MAX_MODEL_LEN)), limit)
        self.options = options
        self.model_dir = target_dir(self.target)
        self.export_root = replica_export_root(get_settings().data_dir / "vllm-exports")
        #: every engine this replica started and has not closed (its current one, those
        #: retiring after a swap): closed at stop, which removes their exported files
        self._engines: weakref.WeakSet[VllmEngine] = weakref.WeakSet()

    def _initial(self, speculation: bool) -> ServedVersion | None:
        return None  # an engine starts in prime(), not here

    def prime(self) -> None:
        """Start the engine of the live version (builtin-ngram without one, or if it
        fails); blocking. :meth:`start` then follows the pointer."""
        if self._current is None:
            self._current = self._first()

    def start(self) -> None:
        self.prime()
        super().start()

    def stop(self) -> None:
        """Stop following the pointer; close every engine this replica started (current,
        retiring or one a swap started while it stopped)."""
        super().stop()
        current = [self._current.engine] if self._current is not None else []
        for engine in {id(e): e for e in (*current, *self._engines)}.values():
            engine.close()
        shutil.rmtree(self.export_root, ignore_errors=True)

    def _first(self) -> ServedVersion:
        if not self._speculation:
            return self._engine_version(OFF_VERSION, "none", None)
        wanted = self._pointer() if self.follows_pointer else None
        if wanted is not None and wanted[0] != BUILTIN_VERSION:
            try:
                return self._load(wanted[0])
            except VersionLoadError as exc:
                self._refused(*wanted, exc)
        return self._load(BUILTIN_VERSION)

    def _pointer(self) -> tuple[str, int] | None:
        try:
            with store.session_scope(self.db, readonly=True) as session:
                pointer = store.get_live(session, deployment=self.deployment)
                row = store.get_deployment(session, name=self.deployment)
            if row is not None and row.k_bands:  # the first engine starts with them
                self._read_bands(row.k_bands)
        except Exception as exc:  # database down at start: serve the built-in version
            self._note_poll_error(f"{type(exc).__name__}: {exc}")
            return None
        return (pointer.version, pointer.generation) if pointer else None

    def _load(self, version: str) -> ServedVersion:
        """``version`` ready to serve: loaded into the running engine where its shapes allow
        (:mod:`autospec.engine.vllm.swap`), else in an engine of its own; every swap audited."""
        kind, spec = load_speculator_version(self.db, self.target, version, actor=self.actor,
                                             deployment=self.deployment)
        reason = vllm_refusal(kind, getattr(spec, "config", None), self.target.info)
        if reason is not None:
            raise VersionLoadError(f"version {version!r}: {reason}")
        started = time.perf_counter()
        out, exported = self._export(version, spec)
        current = self._current
        if current is None:  # the first engine of this replica
            return self._engine_version(version, kind, exported.speculative_config, out)
        shape = draft_shape(exported.speculative_config, out)
        running = vllm_engine(current.engine).shape
        why = in_place_refusal(running, shape) or self._bands_refusal(current)
        if why is None:
            try:
                new = self._in_place(version, kind, current, shape, out)
            except TimeoutError:  # it may still land: what the drafter holds is not known
                why = (f"the in-place load did not finish within {RPC_TIMEOUT_S:.0f} s; the "
                       "running engine retires")
            finally:
                if why is None:
                    shutil.rmtree(out, ignore_errors=True)
        if why is not None:
            new = self._engine_version(version, kind, exported.speculative_config, out)
            self._unseat_segments()
        self._record_swap(version, why, time.perf_counter() - started)
        return new

    def _held(self, version: str) -> ServedVersion | None:
        """None: a segment's slot drafts only the requests that name it, so the deployment's
        version is loaded as the engine's own even when a segment holds it too."""
        return None

    def _unseat_segments(self) -> None:
        """A new engine serves the deployment: the segments' slots are in the old one (which
        finishes its requests on them); the next poll loads them into the new one."""
        self._by_segment, self._segments_wanted, self._segment_failed = {}, {}, {}

    def _bands_refusal(self, current: ServedVersion) -> str | None:
        """Why ``current``'s engine cannot take new versions: its bands are no longer the
        deployment's (vLLM fixes them when an engine starts)."""
        want = None if self.serving_bands is None else str(self.serving_bands)
        have = vllm_engine(current.engine).k_bands
        if current.kind == "none" or have == want:
            return None
        return f"the concurrency bands changed ({have or 'none'} -> {want or 'none'})"

    def _read_bands(self, text: str | None) -> bool:
        """The policy's bands, unless vLLM would drop them (data parallelism:
        :func:`~autospec.serve.bands.vllm_bands_refusal`): then refused, logged and audited
        once, and the engine drafts at its k as before."""
        why = vllm_bands_refusal(self.options) if text else None
        if why is None:
            return super()._read_bands(text)
        log.error("ignoring the deployment's concurrency bands %r: %s", text, why)
        self._bad_bands = text
        try:
            with store.session_scope(self.db) as session:
                store.record_event(session, kind="failure", actor=self.actor, reason=why,
                                   deployment=self.deployment,
                                   details={"what": "concurrency bands", "bands": text,
                                            "replica": self.actor})
        except Exception:  # the audit log is best effort here; the replica keeps serving
            log.exception("could not record the refusal of the bands %r", text)
        return False

    def _follow_bands(self, text: str | None, wanted: tuple[str, int] | None) -> None:
        """New bands from the policy: the engine restarts with them once this poll has
        followed the pointer (:meth:`poll_once`)."""
        super()._follow_bands(text, wanted)
        self._bands_generation = wanted[1] if wanted else 0

    def poll_once(self) -> bool:
        """The pointers followed; then, where the policy's bands changed and no swap of this
        poll started an engine with them (a moved pointer's does: :meth:`_bands_refusal`),
        the current version restarts in an engine that drafts by them (vLLM's scheduler
        reads them once, at the start), audited as a swap. A restart that fails (vLLM out
        of memory beside the running engine...) is tried again after a growing delay
        (:meth:`_restart_for_bands`) until the engine drafts by the bands."""
        swapped = super().poll_once()
        fresh, self._bands_generation = self._bands_generation, None
        current, retry = self._current, self._bands_retry
        if current is None or (fresh is None and retry is None):
            return swapped
        if self.last_poll_error is not None:  # the store is down: retried once it answers
            return swapped
        if self._bands_refusal(current) is None:  # it drafts by them (or they changed back)
            self._bands_retry = None
        elif fresh is not None:
            self._restart_for_bands(current, fresh)
        elif retry is not None and time.monotonic() >= retry.due:
            self._restart_for_bands(current, retry.generation)
        return swapped

    def _restart_for_bands(self, current: ServedVersion, generation: int) -> None:
        """Restart ``current`` in an engine that drafts by the serving bands; if that fails,
        audit it and try again :data:`BANDS_RETRY_S` later, doubled at each failure up to
        :data:`BANDS_RETRY_MAX_S` (one event per failure, never one per poll)."""
        failures = self._bands_retry.failures if self._bands_retry is not None else 0
        delay = min(BANDS_RETRY_S * 2 ** failures, BANDS_RETRY_MAX_S)
        details = {"restart": "concurrency bands", "bands": str(self.serving_bands or "none"),
                   "failures": failures + 1, "retry_in_s": delay}
        try:  # no pointer moves: the record of the pointer's failed version stays as it is
            restarted = self._swap_to(current.name, generation, details=details, pointer=False)
        except Exception as exc:  # the store failed under the load: tried again later
            log.warning("restarting %s with the bands failed: %s", current.name, exc)
            restarted = False
        if restarted:
            self._bands_retry = None
            return
        self._bands_retry = _BandsRetry(generation, failures + 1, time.monotonic() + delay)
        log.warning("restarting %s with the concurrency bands %s failed (%d so far): "
                    "trying again in %.0f s", current.name, details["bands"], failures + 1,
                    delay)

    def _follow_segments(self, wanted: dict[str, tuple[str, int]]) -> None:
        """Hold one slot per version the segment pointers name, in the running engine's
        proposer (see the module doc), then drop the slots no pointer names any more; once
        an engine runs."""
        if self._current is not None:
            super()._follow_segments(wanted)

    def _segment_reusable(self) -> dict[str, ServedVersion]:
        """The slots held: never the engine's own drafter, which every other request drafts
        with (a segment pinned to the deployment's version gets a slot of its own)."""
        return {v.name: v for v in self._by_segment.values()}

    def _free_segment_versions(self, old: dict[str, ServedVersion]) -> None:
        """Drop the slots of ``old`` no segment pointer names any more."""
        held = {v.name for v in self._by_segment.values()}
        for name in {v.name for v in old.values()} - held:
            self._drop_slot(vllm_engine(self.current.engine), name)

    def _load_for_segment(self, version: str) -> ServedVersion:
        """``version`` loaded into a slot of the running engine, for a segment;
        :class:`VersionLoadError` where it cannot be (not a suffix version, or the engine
        has no autospec proposer)."""
        current = self.current
        kind, spec = load_speculator_version(self.db, self.target, version, actor=self.actor,
                                             deployment=self.deployment)
        engine = vllm_engine(current.engine)
        running = engine.shape
        if not vllm_per_request(kind):
            raise VersionLoadError(f"version {version!r} is {kind}: on vLLM a segment is "
                                   "drafted by a version of its own only if it is a suffix "
                                   "version (one engine has one draft model)")
        if current.kind != kind:
            raise VersionLoadError(
                f"version {version!r}: the deployment's version {current.name} is not a "
                f"{kind} version, so its vLLM engine has no proposer to hold a segment's "
                f"{kind} version")
        reason = vllm_refusal(kind, getattr(spec, "config", None), self.target.info)
        if reason is not None:
            raise VersionLoadError(f"version {version!r}: {reason}")
        started = time.perf_counter()
        out, exported = self._export(version, spec)
        try:
            why = in_place_refusal(running, draft_shape(exported.speculative_config, out))
            if why is not None:
                raise VersionLoadError(f"version {version!r} does not fit the running vLLM "
                                       f"engine: {why}")
            load_slot(engine, out, version)
        except VersionLoadError:
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError):  # it may still land: drop it after it
                self._drop_slot(engine, version)
            raise VersionLoadError(f"version {version!r}: loading it for a segment into the "
                                   f"running vLLM engine failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
        finally:
            shutil.rmtree(out, ignore_errors=True)
        self._sizes[version] = tensor_bytes(spec.state_tensors())
        log.info("%s loaded into a slot of the running vLLM engine in %.2fs, for segments",
                 version, time.perf_counter() - started)
        return ServedVersion(version, kind, engine, slot=version)

    def _drop_slot(self, engine: VllmEngine, version: str) -> None:
        """Forget ``version``'s slot in ``engine`` (best effort: a slot left behind only
        holds memory until the engine goes)."""
        try:
            drop_slot(engine, version)
            log.info("freed %s: no segment pointer names it any more", version)
        except Exception:
            log.exception("could not drop the slot of %s", version)

    def _export(self, version: str, spec: Any) -> tuple[Path, Any]:
        """``spec`` exported for vLLM into a fresh directory under the export root."""
        self.export_root.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=f"{version}-k{self.k}-", dir=self.export_root))
        try:
            return out, export_speculator(spec, self.target, out, k=self.k,
                                          source={"version": version})
        except Exception as exc:
            shutil.rmtree(out, ignore_errors=True)
            raise VersionLoadError(f"version {version!r}: export for vLLM failed: "
                                   f"{type(exc).__name__}: {exc}") from exc

    def _in_place(self, version: str, kind: str, current: ServedVersion, shape: DraftShape,
                  out: Path) -> ServedVersion:
        """``version`` loaded into the engine serving ``current``, between its steps."""
        engine = vllm_engine(current.engine)
        try:
            report = load_in_place(engine, shape, out, version)
        except TimeoutError:
            raise  # the caller starts an engine of its own instead
        except Exception as exc:
            raise VersionLoadError(f"version {version!r}: the in-place load into the running "
                                   f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        engine.loaded.append(version)
        log.info("%s loaded into the running vLLM engine in %.2fs (was %s)", version,
                 report["seconds"], current.name)
        return ServedVersion(version, kind, engine)

    def _record_swap(self, version: str, why: str | None, seconds: float) -> None:
        """Audit a swap: in place, or a second engine started, and why (best effort)."""
        mode = "in-place" if why is None else "new engine"
        reason = (f"loaded into the running vLLM engine in {seconds:.2f} s" if why is None
                  else f"a second vLLM engine was started ({seconds:.1f} s): {why}")
        try:
            with store.session_scope(self.db) as session:
                store.record_event(session, kind="swap", actor=self.actor, reason=reason,
                                   deployment=self.deployment, version=version,
                                   from_version=self._current.name if self._current else None,
                                   details={"mode": mode, "why": why, "seconds": round(seconds, 3),
                                            "replica": self.actor, "engine": "vllm"})
        except Exception:  # the audit log is best effort here; the replica keeps serving
            log.exception("could not record the swap to %s", version)

    def _engine_version(self, version: str, kind: str,
                        speculative_config: dict[str, Any] | None,
                        export_dir: Path | None = None) -> ServedVersion:
        """An engine for ``version``; ``export_dir`` (its exported files) is removed when
        the engine shuts down, or now if it fails to start."""
        started = time.perf_counter()
        engine = None
        bands = self.serving_bands if speculative_config else None
        try:
            engine = VllmEngine(self.model_dir, dtype=self.target.dtype_name,
                                speculative_config=with_bands(speculative_config, bands),
                                max_model_len=self.max_model_len, options=self.options,
                                cleanup=export_dir)
            if vllm_seeded(kind):  # the proposer starts empty: its data goes in now
                load_in_place(engine, draft_shape(speculative_config, export_dir), export_dir,
                              version)
        except Exception as exc:
            if engine is not None:
                engine.close()  # removes export_dir with it
            elif export_dir is not None:
                shutil.rmtree(export_dir, ignore_errors=True)
            raise VersionLoadError(f"version {version!r}: vLLM could not start with it: "
                                   f"{type(exc).__name__}: {exc}") from exc
        self._engines.add(engine)
        if self._stop.is_set():  # the replica stopped while it started: nothing would close it
            engine.close()
            raise VersionLoadError(f"version {version!r}: the replica is stopping",
                                   audited=True)  # not a failure of the version: no event
        engine.shape = draft_shape(speculative_config, export_dir)
        engine.k_bands = None if bands is None else str(bands)  # fixed for its life
        engine.loaded.append(version)
        log.info("vLLM engine for %s started in %.1fs", version, time.perf_counter() - started)
        return ServedVersion(version, kind, engine)


def vllm_engine(engine: Engine) -> VllmEngine:
    """A version's engine as the vLLM engine it is: every version this manager (and a vLLM
    replica's server) holds has one it started (tests' stand-ins play its part)."""
    return cast(VllmEngine, engine)


def with_bands(speculative_config: dict[str, Any] | None,
               bands: KBands | None) -> dict[str, Any] | None:
    """``speculative_config`` with vLLM's per-batch-size k from the deployment's bands."""
    if speculative_config is None or bands is None:
        return speculative_config
    return {**speculative_config, "num_speculative_tokens_per_batch_size": vllm_schedule(bands)}

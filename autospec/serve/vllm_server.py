"""The vLLM serving path: one replica's :class:`VllmServer`, decoding with vLLM's async engine.

It is an :class:`~autospec.serve.server.LLMServer` (same admission limit and 503s, metrics,
traffic row, health, the app of :mod:`autospec.serve.http`) whose requests go to a
:class:`~autospec.serve.vllm_engine.VllmEngine` instead of the decode thread: vLLM batches
every admitted request (continuous batching). Chat and completions are answered by vLLM's
own OpenAI layer (:mod:`autospec.serve.vllm_http`, :mod:`autospec.serve.vllm_openai`) through
:meth:`VllmServer.bind`, :meth:`~VllmServer.report_vllm` and :meth:`~VllmServer.release`;
the hand-written request path (:meth:`~VllmServer.generate`, :meth:`~VllmServer.stream`)
remains for in-process callers and for stand-in engines in tests (``api_args`` None), which
vLLM's layer cannot run over.

**Versions** (:class:`VllmVersionManager`). A version is loaded as everywhere
(:func:`autospec.versions.load_speculator_version`, checksums and registration checked),
refused if vLLM cannot run it faithfully (:func:`autospec.serve.vllm_engine.vllm_refusal`),
and exported with :func:`~autospec.interop.export.export_speculator` into a fresh directory
under ``<data dir>/vllm-exports/``. ``builtin-ngram`` is vLLM's ``ngram`` method (prompt
lookup with autospec's n-gram bounds); a ``suffix`` version is autospec's custom proposer
(:mod:`autospec.interop.vllm_proposer`), its index loaded into the engine once it has
started; with speculation off the engine has no speculative config (version name ``off``).

**Hot swap, in place.** When the live pointer moves, the watcher thread exports the new
version and, when it fits the running engine (same vLLM method and k; for a draft model the
same config and tensor shapes: :mod:`autospec.serve.vllm_swap`), loads it into that engine
between two of its steps (new draft weights or a new suffix index, through vLLM's
``collective_rpc`` and autospec's worker extension): no second engine, no second copy of
the target, well under a second on a CPU. Requests in flight keep decoding; the steps after
the load draft with the new version, and a request drafted by both is named with both (the
response's ``drafted_by`` in the ``autospec`` object and its traffic row's
``sampling.drafted_by``). Rollback is the same move.

**Hot swap, side by side** — only when the new version does not fit (another kind, ``k`` or
shape): its engine starts beside the running one (two engines' memory meanwhile), then the
reference moves: requests admitted from then on go to the new engine, those already running
finish on the old one, which shuts down when its last request ends. Every swap is audited
(event ``swap``: ``in-place`` or ``new engine`` and why). A version that fails (refused kind,
load error, vLLM failing to start) leaves the replica serving what it had and is audited once
(``failure`` event), exactly as on the native path.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autospec import store
from autospec.engine.generate import GenerationResult
from autospec.engine.target import load_target
from autospec.interop.export import export_speculator, target_dir
from autospec.numerics import record_served
from autospec.serve.bands import KBands, vllm_schedule
from autospec.serve.config import BUILTIN_VERSION, OFF_VERSION, ServeConfig
from autospec.serve.errors import APIError
from autospec.serve.schemas import _Request
from autospec.serve.server import (
    Job,
    LLMServer,
    PositionLogprobs,
    Prepared,
    RequestContext,
    Served,
    Streamed,
)
from autospec.serve.versions import ServedVersion, VersionManager
from autospec.serve.vllm_engine import (
    VllmEngine,
    VllmMetricsCollector,
    drafting_now,
    reported_summary,
    vllm_refusal,
    vllm_stats,
)
from autospec.serve.vllm_openai import (
    Binding,
    VllmApi,
    api_args,
    autospec_params,
    unreplayable,
    vllm_settings,
)
from autospec.serve.vllm_swap import DraftShape, draft_shape, in_place_refusal, load_in_place
from autospec.settings import get_settings
from autospec.versions import VersionLoadError, load_speculator_version

log = logging.getLogger(__name__)

#: vLLM's max_model_len unless ``vllm_options`` sets it (bounded by the target's context)
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class VllmServed(Served):
    """A finished request and vLLM's own acceptance summary of each choice (as reported);
    ``index``: the choice a traffic row is written for."""

    reported: list[dict[str, Any] | None] = field(default_factory=list)
    index: int = 0


class VllmVersionManager(VersionManager):
    """:class:`VersionManager` whose versions are vLLM engines (see the module doc)."""

    def __init__(self, *, config: ServeConfig, **kwargs: Any) -> None:
        self.config = config
        self._speculation = bool(kwargs.get("speculation", True))
        super().__init__(**{"bands": config.bands, **kwargs})
        options = dict(config.vllm_options)
        limit = self.target.info.max_position_embeddings
        self.max_model_len = min(int(options.pop("max_model_len", DEFAULT_MAX_MODEL_LEN)), limit)
        self.options = options
        self.model_dir = target_dir(self.target)
        self.export_root = get_settings().data_dir / "vllm-exports"

    def _initial(self, speculation: bool) -> ServedVersion:
        return None  # type: ignore[return-value]  # an engine starts in start(), not here

    def prime(self) -> None:
        """Start the engine of the live version (builtin-ngram without one, or if it
        fails); blocking. :meth:`start` then follows the pointer."""
        if self._current is None:
            self._current = self._first()

    def start(self) -> None:
        self.prime()
        super().start()

    def stop(self) -> None:
        super().stop()
        if self._current is not None:
            self._current.engine.shutdown()

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
        (:mod:`autospec.serve.vllm_swap`), else in an engine of its own; every swap audited."""
        kind, spec = load_speculator_version(self.db, self.target, version, actor=self.actor,
                                             deployment=self.deployment)
        reason = vllm_refusal(kind, getattr(spec, "config", None))
        if reason is not None:
            raise VersionLoadError(f"version {version!r}: {reason}")
        started = time.perf_counter()
        out, exported = self._export(version, spec)
        current = self._current
        if current is None:  # the first engine of this replica
            return self._engine_version(version, kind, exported.speculative_config, out)
        shape = draft_shape(exported.speculative_config, out)
        why = in_place_refusal(current.engine.shape, shape) or self._bands_refusal(current)
        if why is None:
            try:
                new = self._in_place(version, kind, current, shape, out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
        else:
            new = self._engine_version(version, kind, exported.speculative_config, out)
        self._record_swap(version, why, time.perf_counter() - started)
        return new

    def _bands_refusal(self, current: ServedVersion) -> str | None:
        """Why ``current``'s engine cannot take new versions: its bands are no longer the
        deployment's (vLLM fixes them when an engine starts)."""
        want = None if self.serving_bands is None else str(self.serving_bands)
        have = getattr(current.engine, "k_bands", None)
        if current.kind == "none" or have == want:
            return None
        return f"the concurrency bands changed ({have or 'none'} -> {want or 'none'})"

    def _follow_bands(self, text: str | None, wanted: tuple[str, int] | None) -> None:
        """New bands from the policy: the current version restarts in an engine that drafts
        by them (vLLM's scheduler reads them once, at the start), audited as a swap."""
        super()._follow_bands(text, wanted)
        current = self._current
        if current is not None and self._bands_refusal(current) is not None:
            self._swap_to(current.name, wanted[1] if wanted else 0)

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
        engine = current.engine
        try:
            report = load_in_place(engine, shape, out, version)
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
        reason = "loaded into the running vLLM engine" if why is None else \
            f"a second vLLM engine was started: {why}"
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
            if kind == "suffix":  # autospec's proposer starts empty: its index goes in now
                load_in_place(engine, draft_shape(speculative_config, export_dir), export_dir,
                              version)
        except Exception as exc:
            if engine is not None:
                engine.shutdown()  # removes export_dir with it
            elif export_dir is not None:
                shutil.rmtree(export_dir, ignore_errors=True)
            raise VersionLoadError(f"version {version!r}: vLLM could not start with it: "
                                   f"{type(exc).__name__}: {exc}") from exc
        engine.shape = draft_shape(speculative_config, export_dir)
        engine.k_bands = None if bands is None else str(bands)  # fixed for its life
        engine.loaded.append(version)
        log.info("vLLM engine for %s started in %.1fs", version, time.perf_counter() - started)
        return ServedVersion(version, kind, engine)  # type: ignore[arg-type]


def with_bands(speculative_config: dict[str, Any] | None,
               bands: KBands | None) -> dict[str, Any] | None:
    """``speculative_config`` with vLLM's per-batch-size k from the deployment's bands."""
    if speculative_config is None or bands is None:
        return speculative_config
    return {**speculative_config, "num_speculative_tokens_per_batch_size": vllm_schedule(bands)}


def position_logprobs(output: Any, wanted: int) -> list[PositionLogprobs]:
    """A finished completion's log-probabilities (vLLM's ``logprobs``: per generated token a
    dict of token id -> ``Logprob``, the chosen token and the ``wanted`` likeliest)."""
    positions = []
    for token_id, entries in zip(output.token_ids, output.logprobs or [], strict=False):
        top = sorted(((tid, float(e.logprob)) for tid, e in entries.items()
                      if e.rank is not None and e.rank <= wanted),
                     key=lambda item: -item[1])[:wanted]
        positions.append(PositionLogprobs(int(token_id), float(entries[token_id].logprob),
                                          tuple(top)))
    return positions


class VllmServer(LLMServer):
    """One replica decoding with vLLM (see the module doc)."""

    @classmethod
    def from_config(cls, config: ServeConfig, *, actor: str = "serve") -> VllmServer:
        """As :meth:`LLMServer.from_config`; the target autospec loads (on the CPU unless
        ``device`` says otherwise) tokenizes, exports and is recorded; vLLM loads the same
        directory in the same dtype."""
        target = load_target(config.target, dtype=config.dtype, device=config.device or "cpu")
        need_db = config.log_traffic or config.speculation == "live"
        db = store.open_store(config.database_url) if need_db else None
        if db is not None:
            record_served(db, deployment=config.deployment, spec=config.target, target=target,
                          actor=actor, engine="vllm")
        writer = store.TrafficWriter(db) if (db is not None and config.log_traffic) else None
        versions = VllmVersionManager(
            config=config, target=target, db=db, deployment=config.deployment,
            k=config.speculator_k, speculation=config.speculation == "live",
            poll_interval_s=config.poll_interval_s, report_interval_s=config.report_interval_s,
            actor=actor)
        args = api_args(versions.model_dir, config.served_model_name,
                        config.vllm_api_options)  # refused options fail the replica now
        versions.prime()  # the first engine, before the server reads versions.current
        server = cls(target, versions, config=config, writer=writer)
        server.api_args = args
        server.start()
        return server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics.registry.register(VllmMetricsCollector())  # vLLM's vllm:* series too
        #: vLLM's server arguments: the HTTP app serves vLLM's OpenAI layer with them
        #: (:mod:`autospec.serve.vllm_http`); None: autospec's own layer (tests' stand-ins)
        self.api_args: Any = None
        self._api: VllmApi | None = None
        self._api_engine: Any = None  # the engine whose renderer vLLM's handlers hold
        self._api_lock = asyncio.Lock()

    def install_routes(self, app: Any) -> bool:
        """vLLM's OpenAI layer serves chat and completions (:mod:`autospec.serve.vllm_http`)
        when this replica runs real vLLM engines."""
        if self.api_args is None:
            return False
        from autospec.serve.vllm_http import add_routes

        add_routes(app, self)
        return True

    async def openai_api(self) -> VllmApi:
        """vLLM's chat and completion handlers over this replica's engines, built on the
        loop that serves them, and again for each new engine (vLLM's handlers keep the
        renderer of the engine they were built over, which goes when that engine does)."""
        async with self._api_lock:
            engine = self.versions.current.engine
            if self._api is None or self._api_engine is not engine:
                self._api = await VllmApi.build(self, self.api_args)
                self._api_engine = engine
        return self._api

    # -- requests through vLLM's OpenAI layer ------------------------------------------------

    def bind(self, ctx: RequestContext) -> Binding:
        """Admit a request for vLLM's layer (an overload raises :class:`Overloaded`) and
        bind it to the live version; it is in flight until :meth:`release`."""
        job = self._admit()
        self._start(job)  # vLLM batches every admitted request: no queue of autospec's
        return Binding(ctx, job, self.versions.current)

    def release(self, binding: Binding) -> None:
        """The request's answer has ended (idempotent)."""
        if not binding.released:
            binding.released = True
            self._finish(binding.job)

    def report_vllm(self, binding: Binding, output: Any, sampling_params: Any, ttft_s: float,
                    first: int) -> VllmServed:
        """Record a request vLLM's layer decoded: one traffic row per choice, with every
        sampling setting it was decoded under (see :mod:`autospec.serve.vllm_openai`)."""
        ids = list(output.prompt_token_ids or [])
        text = output.prompt if output.prompt is not None else self.target.tokenizer.decode(ids)
        p = Prepared(binding.ctx, ids, text, autospec_params(sampling_params), binding.version,
                     n=int(sampling_params.n or 1),
                     vllm={"settings": vllm_settings(sampling_params),
                           "unreplayable": unreplayable(sampling_params),
                           "logprobs": sampling_params.logprobs})
        served = replace(self._served(p, output, ttft_s, first),
                         concurrency=self.concurrency(binding.job),
                         in_flight=binding.job.in_flight)
        self._report(p, served)
        return served

    def _on_swap(self, old: ServedVersion, new: ServedVersion) -> None:
        super()._on_swap(old, new)
        if old.engine is not new.engine:  # a second engine was started: retire the first
            old.engine.retire()  # type: ignore[attr-defined]  # after its running requests

    def health(self) -> dict[str, Any]:
        state = super().health()
        engine = self.versions.current.engine
        if getattr(engine, "errored", False):
            state["problems"].append("vLLM engine errored")
            state["ok"] = False
        state["engine"] = "vllm"
        return state

    # -- decoding ----------------------------------------------------------------------------

    async def generate(self, p: Prepared) -> Served:
        """Decode ``p`` to the end in vLLM (batched with the others); a cancelled caller
        (client gone) aborts the request in vLLM and it is not logged."""
        job = self._admit()
        served = None
        async for item in self._decode_vllm(p, job):
            served = item
        assert isinstance(served, Served)
        return served

    def stream(self, p: Prepared) -> Streamed:
        """Admit ``p`` now (an overload raises here); it decodes as the result is iterated."""
        job = self._admit()
        return Streamed(self._decode_vllm(p, job), lambda: self.abandon(job))

    async def _decode_vllm(self, p: Prepared, job: Job) -> AsyncIterator[list[int] | Served]:
        """Each step's new token ids, then the :class:`VllmServed` request (reported)."""
        if not self._start(job):
            return
        finished = False
        first = drafting_now(p.version.engine)
        steps = self._steps(p, job)
        try:
            last, ttft = None, 0.0
            async for completion, new in steps:
                last = completion
                ttft = ttft or time.perf_counter() - p.ctx.arrived
                if new:
                    yield new
            if job.cancel.is_set():
                self.metrics.abandoned.labels("decoding").inc()
                log.info("request abandoned while decoding in vLLM")
                return
            served = replace(self._served(p, last, ttft, first),
                             concurrency=self.concurrency(job), in_flight=job.in_flight)
            self._report(p, served)
            finished = True
            yield served
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                self.metrics.abandoned.labels("decoding").inc()
            raise
        finally:
            await steps.aclose()  # aborts the request in vLLM if it has not finished
            self._finish(job)

    async def _steps(self, p: Prepared, job: Job) -> AsyncIterator[tuple[Any, list[int]]]:
        """vLLM's cumulative output after each step and the first choice's new token ids
        (a streamed request has one choice)."""
        engine: VllmEngine = p.version.engine  # type: ignore[assignment]
        outputs = engine.generate(p.prompt_ids, p.params, f"autospec-{uuid.uuid4().hex}",
                                  n=p.n, logprobs=p.logprobs)
        sent = 0
        try:
            async for out in outputs:
                first = out.outputs[0]
                new = list(first.token_ids[sent:])
                sent = len(first.token_ids)
                yield out, new
                if job.cancel.is_set():
                    return
        finally:
            await outputs.aclose()  # aborts the request in vLLM if it has not finished

    def _served(self, p: Prepared, output: Any, ttft_s: float, first: int = 0) -> VllmServed:
        """The finished request from vLLM's last output (every choice, in index order);
        named after the version(s) loaded in its engine from position ``first`` on."""
        completions = sorted(output.outputs, key=lambda c: c.index) if output else []
        unfinished = [c.finish_reason for c in completions if c.finish_reason not in
                      ("stop", "length")]
        if not completions or unfinished:
            raise APIError(500, "vLLM ended the request: "
                           f"{unfinished[0] if unfinished else 'no output'}",
                           type="internal_error", code="engine_error")
        latency = time.perf_counter() - p.ctx.arrived
        results = [self._result(p, c, ttft_s, latency) for c in completions]
        logprobs = None if p.logprobs is None else \
            [position_logprobs(c, p.logprobs) for c in completions]
        version, drafted_by = p.version, []
        loaded = getattr(p.version.engine, "loaded", None)
        if loaded:
            drafted = p.version.engine.drafted_by(first)
            if len(drafted) > 1:
                drafted_by = drafted
            elif drafted[0] != version.name:  # swapped in place just before it started
                version = replace(version, name=drafted[0])
        return VllmServed(version, results[0], latency_s=latency, ttft_s=ttft_s,
                          extra=results[1:], logprobs=logprobs, drafted_by=drafted_by,
                          reported=[reported_summary(c) for c in completions])

    def _result(self, p: Prepared, completion: Any, ttft_s: float,
                latency: float) -> GenerationResult:
        engine: VllmEngine = p.version.engine  # type: ignore[assignment]
        stats = vllm_stats(completion, prompt_tokens=len(p.prompt_ids), k=engine.k,
                           ttft_s=ttft_s, total_s=latency)
        return GenerationResult(token_ids=list(completion.token_ids),
                                finish_reason=completion.finish_reason, stats=stats,
                                text=completion.text)

    def check_features(self, req: _Request) -> None:
        """vLLM serves ``n > 1`` and ``logprobs`` (the schema refuses them streamed)."""

    def _report(self, p: Prepared, s: Served) -> None:
        """One traffic row (and one set of metrics) per choice: each is a sequence the
        target decoded with the speculator, with its own acceptance."""
        for index, result in enumerate(s.choices):
            super()._report(p, replace(s, result=result, extra=[], index=index))

    def _record(self, p: Prepared, s: Served) -> store.RequestRecord:
        record = super()._record(p, s)
        reported = getattr(s, "reported", None) or [None]
        index = getattr(s, "index", 0)
        vllm = p.vllm or {}
        record.sampling = {**(record.sampling or {}), "engine": "vllm",
                           "vllm_spec_decode": reported[index], "n": p.n, "choice": index,
                           "logprobs": vllm.get("logprobs", p.logprobs)}
        if vllm.get("settings"):
            record.sampling["vllm"] = vllm["settings"]
        if vllm.get("unreplayable"):  # shadow replay leaves it out (evaluate.run.replayable)
            record.sampling["unreplayable"] = vllm["unreplayable"]
        if s.drafted_by:
            record.sampling["drafted_by"] = list(s.drafted_by)
        bands = getattr(p.version.engine, "k_bands", None)
        if bands is not None:  # vLLM's scheduler chose k per step from the batch size
            record.sampling["k_bands"] = bands
        return record

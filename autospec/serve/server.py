"""``LLMServer``: the deployment's core, one class for every engine, testable without Ray.

It turns OpenAI-shaped requests into engine calls, one replica's worth, over
:class:`~autospec.engine.interface.Engine`; what differs by engine is held, not overridden
(:mod:`autospec.serve.engines` puts them together): the version manager (``versions``), the
decoder (``decoder``: the native engine's decode thread or vLLM's batching,
:mod:`autospec.serve.decode`) and, on vLLM, vLLM's own OpenAI layer (``api``,
:class:`~autospec.serve.vllm_http.VllmLayer`).

- **Admission.** At most ``max_pending_requests`` requests may be admitted (waiting or
  decoding); the next one gets a fast 503 (``Retry-After``). Tokenization runs in the
  default thread pool.
- **Shedding.** A request that has waited ``max_queue_wait_s`` in the replica's queue
  without starting to decode is refused with the same 503 (:meth:`LLMServer.shed`: when the
  bound passes, by its decoder; :meth:`LLMServer.begin`: if the decode thread reaches it
  later) and never decoded; a request that has started is never shed. Both refusals count
  in ``autospec:request_rejected_total{reason}`` (``pending_limit``, ``queue_wait``).
- **Versions.** A request reads its version once, when admitted: its segment's
  (:meth:`VersionManager.for_segment`: the segment pointer's version, else
  :attr:`VersionManager.current`), and decodes with that version's engine to the end (see
  :mod:`autospec.serve.versions`). After a swap to another engine the old one is retired
  (it closes when its requests end) unless a segment still drafts with it.
- **Reporting.** When a request finishes, its :class:`RequestStats` go to the metrics
  (:mod:`autospec.serve.metrics`) and, unless traffic logging is off, one
  :class:`~autospec.store.RequestRecord` per choice goes to the traffic writer, whose
  ``record`` only enqueues. The row holds the prompt and output token ids exactly as the
  target produced them (EOS and stop-string tokens included), the texts, the sampling
  parameters, the version, latency and TTFT from arrival, the load and k it was decoded at
  (``banded`` when a concurrency band drafted fewer tokens than the version's k), and the
  acceptance figures (and what the decoder adds:
  :meth:`~autospec.serve.decode.Decoder.record`). A caller that sent ``x-autospec-log: off``
  is recorded with ``opted_out``, under its route rather than its
  ``x-autospec-segment``, and the store keeps nothing else it sent: no text, ids, stop
  strings or seed (:mod:`autospec.store.privacy`).
- **Abandoned requests.** Each admitted request is a :class:`Job`. When its client goes
  (:meth:`LLMServer.abandon`: cancellation of :meth:`~LLMServer.generate`, a stream closed
  or never read), a waiting job leaves the queue at once and a decoding one stops after its
  current step; either way it is counted in ``autospec:request_abandoned_total`` and not
  logged.

Nothing here knows HTTP: :mod:`autospec.serve.http` maps requests and errors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any, Protocol, cast

from autospec import store
from autospec.engine.choice import AUTO, check_vllm_installed, resolve_engine
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import ChatTemplateError, Target, load_target
from autospec.numerics import record_served
from autospec.serve.bands import drafted_fewer
from autospec.serve.config import HOLDOUT_ON_VLLM, OFF_VERSION, ServeConfig
from autospec.serve.decode import Decoder, ThreadDecoder
from autospec.serve.engines import DEFAULT_DEVICE, engine_parts
from autospec.serve.errors import APIError
from autospec.serve.holdout import Holdout
from autospec.serve.kernel_caches import CACHE_VARS
from autospec.serve.load import InFlight
from autospec.serve.metrics import ServeMetrics
from autospec.serve.metrics_ledger import register_ledger
from autospec.serve.requests import (
    Job,
    Overloaded,
    Prepared,
    RequestContext,
    Served,
    Streamed,
    check_vocab,
    end_user,
    shaping,
    shutting_down,
)
from autospec.serve.schemas import ChatCompletionRequest, CompletionRequest, _Request
from autospec.serve.versions import ServedVersion, VersionManager
from autospec.store.ledger import HOLDOUT_KEY

log = logging.getLogger(__name__)

_GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (as vLLM does)


class OwnRoutes(Protocol):
    """An engine's own OpenAI layer (vLLM's): it adds the chat and completion routes."""

    def install_routes(self, app: Any) -> bool: ...


class LLMServer:
    """One replica: a target, its versions, a decoder, metrics and the traffic writer."""

    def __init__(self, target: Target, versions: VersionManager, *, config: ServeConfig,
                 writer: store.TrafficWriter | None = None,
                 metrics: ServeMetrics | None = None, decoder: Decoder | None = None) -> None:
        self.target, self.versions, self.config = target, versions, config
        self.writer = writer
        self.metrics = metrics or ServeMetrics()
        self.model_name = config.served_model_name
        self.created = int(time.time())
        self.decoder: Decoder = decoder or ThreadDecoder()
        self.decoder.attach(self.metrics)
        #: the engine's own chat and completion routes (vLLM's layer); None: autospec's
        self.api: OwnRoutes | None = None
        self._lock = threading.Lock()
        self._load = InFlight()  # admitted and not finished, over time; guarded by _lock
        self._closed = False
        #: which requests are served with speculation off (autospec/serve/holdout.py)
        self.holdout = Holdout(config.holdout_fraction)
        versions.on_swap = self._on_swap
        versions.on_failure = lambda _version, _reason: self.metrics.load_failures.inc()
        cur = versions.current
        self.metrics.set_version(cur.name, cur.kind)
        if writer is not None:
            store.register_prometheus(writer, registry=self.metrics.registry)

    @classmethod
    def from_config(cls, config: ServeConfig, *, actor: str = "serve") -> LLMServer:
        """The replica for ``config.engine`` (``auto`` resolved here,
        :mod:`autospec.engine.choice`): load the target, open the store, record what this
        deployment serves (target, revision, dtype, engine: :mod:`autospec.numerics`), put
        the engine's parts together (:func:`~autospec.serve.engines.engine_parts`: the live
        version loaded), start watching."""
        engine = resolve_engine(config.engine, config.device)
        log.info("replica engine: %s%s", engine, " (auto)" if config.engine == AUTO else "")
        if engine == "vllm":
            check_vllm_installed()
            if config.holdout_fraction:
                raise ValueError(HOLDOUT_ON_VLLM)
        target = load_target(config.target, dtype=config.dtype,
                             device=config.device or DEFAULT_DEVICE[engine])
        need_db = config.log_traffic or config.speculation == "live"
        db = store.open_store(config.database_url) if need_db else None
        if db is not None:
            record_served(db, deployment=config.deployment, spec=config.target, target=target,
                          actor=actor, engine=engine)
        writer = store.TrafficWriter(db) if (db is not None and config.log_traffic) else None
        parts = engine_parts(engine, config, target=target, db=db, actor=actor)
        server = cls(target, parts.versions, config=config, writer=writer,
                     decoder=parts.decoder)
        if db is not None:  # the deployment's ledger as gauges (serve/metrics_ledger.py)
            register_ledger(server.metrics.registry, db, deployment=config.deployment)
        server.api = parts.api(server) if parts.api is not None else None
        server.start()
        return server

    def start(self) -> None:
        self.versions.start()

    def close(self) -> None:
        """Stop watching, finish the decode queue, flush the traffic writer."""
        if self._closed:
            return
        self._closed = True
        self.versions.stop()
        self.decoder.close()
        if self.writer is not None:
            self.writer.close()

    @property
    def _pending(self) -> int:
        """Requests admitted and not finished (waiting or decoding)."""
        return self._load.count

    def _on_swap(self, old: ServedVersion, new: ServedVersion) -> None:
        self.metrics.set_version(new.name, new.kind, old.name, old.kind)
        if old.engine is not new.engine and not self.versions.holds(old.engine):
            old.engine.retire()  # another engine no segment drafts with: it closes once its
            # running requests have ended

    # -- health ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``ok`` is False when this replica cannot serve; the rest explains."""
        cur = self.versions.current
        problems = []
        if self._closed:
            problems.append("server closed")
        if not self.versions.watching:
            problems.append("live-pointer watcher stopped")
        if cur.engine.errored:
            problems.append(f"{cur.engine.name} engine errored")
        return {"ok": not problems, "problems": problems, "version": cur.name,
                "kind": cur.kind, "engine": cur.engine.name, "pending": self._pending,
                "live_pointer_error": self.versions.last_poll_error,
                "load_failures": self.versions.load_failures,
                "segments": self.versions.segments,
                "segment_versions": self.versions.segment_memory(),
                "kernel_caches": {var: os.environ.get(var) for var in CACHE_VARS},
                "traffic": self.writer.counters.as_dict() if self.writer else None}

    # -- preparing requests ------------------------------------------------------------------

    async def prepare_completion(self, req: CompletionRequest, ctx: RequestContext) -> Prepared:
        self._check_model(req.model)
        if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
            ids = list(cast(list[int], req.prompt))  # the schema's token-id form
            check_vocab(ids, self.target.info.vocab_size, "prompt")
            return self._bind(ctx, ids, None, req, req.max_tokens)
        text = req.prompt[0] if isinstance(req.prompt, list) else req.prompt
        ids = await asyncio.to_thread(self.target.encode_prompt, text)
        return self._bind(ctx, ids, text, req, req.max_tokens)

    async def prepare_chat(self, req: ChatCompletionRequest, ctx: RequestContext) -> Prepared:
        self._check_model(req.model)
        if getattr(self.target.tokenizer, "chat_template", None) is None:
            raise APIError(400, f"model {self.model_name!r} has no chat template; use "
                           "/v1/completions", code="no_chat_template")

        def render() -> tuple[list[int], str]:
            ids = self.target.encode_chat(req.chat())
            return ids, self.target.tokenizer.decode(ids)

        try:
            ids, text = await asyncio.to_thread(render)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages", code="invalid_value") from None
        return self._bind(ctx, ids, text, req, req.requested_max_tokens)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                           f"{self.model_name!r}", type="not_found_error", param="model",
                           code="model_not_found")

    def _bind(self, ctx: RequestContext, ids: list[int], text: str | None, req: _Request,
              max_tokens: int | None) -> Prepared:
        self.check_features(req)
        # the version this request is served by, to the end: its segment's, else the live one
        version = self.versions.for_segment(ctx.segment)
        params = self._params(req, max_tokens, len(ids), version)
        version.engine.check_request(ids, params)  # RequestError -> 400
        # the ledger's control group: speculation off for this one, limits as for the rest
        held_out = version.name != OFF_VERSION and self.holdout.draw()
        if held_out:
            version = self.versions.target_only
        return Prepared(ctx, ids, text, params, version, n=req.n, logprobs=req.wanted_logprobs,
                        held_out=held_out)

    def check_features(self, req: _Request) -> None:
        """A 400 for what this engine does not serve: autospec's engine decodes one choice
        without log-probabilities (the vLLM engine serves both: the decoder's
        ``serves_choices``)."""
        if self.decoder.serves_choices:
            return
        hint = "; `autospec serve --engine vllm` serves it"
        if req.n != 1:
            raise APIError(400, f"n: this server's engine (native) serves n=1 only{hint}",
                           param="n", code="unsupported_value")
        if req.wanted_logprobs is not None:
            raise APIError(400, f"logprobs: this server's engine (native) does not return "
                           f"log-probabilities{hint}", param="logprobs",
                           code="unsupported_value")

    def _params(self, req: _Request, max_tokens: int | None, n_prompt: int,
                version: ServedVersion) -> SamplingParams:
        limit = self.config.max_tokens_limit
        if max_tokens is None:
            room = self.target.info.max_position_embeddings - n_prompt - version.engine.k
            max_tokens = max(1, min(self.config.default_max_tokens, room))
        if not 1 <= max_tokens <= limit:
            field = req.max_tokens_field
            raise APIError(400, f"{field} must be between 1 and {limit}, got {max_tokens}",
                           param=field, code="invalid_value")
        check_vocab((t for t, _ in req.bias), self.target.info.vocab_size, "logit_bias")
        temperature = 0.0 if req.temperature < _GREEDY_BELOW else req.temperature
        return SamplingParams(max_new_tokens=max_tokens, temperature=temperature,
                              top_k=max(0, req.top_k), top_p=req.top_p,
                              seed=None if req.seed is None else req.seed % 2**64,
                              stop=req.stop_strings, ignore_eos=req.ignore_eos,
                              logit_bias=req.bias,
                              presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty)

    # -- decoding ----------------------------------------------------------------------------

    def admit(self) -> Job:
        """Admit a request (a 503 when closed or at the pending limit); it waits now."""
        if self._closed:
            raise shutting_down()
        with self._lock:
            if self._pending >= self.config.max_pending_requests:
                self.metrics.rejected.labels("pending_limit").inc()
                raise Overloaded.pending_limit(self.config.max_pending_requests)
            self.metrics.waiting.inc()
            job = Job()
            job.mark = self._load.enter()
        return job

    def begin(self, job: Job) -> bool:
        """``job`` starts decoding; False if it left the queue while waiting (abandoned or
        shed). A job that has waited past ``max_queue_wait_s`` is shed here instead
        (:class:`Overloaded` raised)."""
        with self._lock:
            if job.state != "waiting":
                return False
            left = self.queue_wait_left(job)
            if left is None or left > 0:
                job.state = "running"
                job.in_flight = self._load.count
                self.metrics.waiting.dec()
                self.metrics.running.inc()
                return True
            refusal = self._shed(job)
        raise refusal

    def queue_wait_left(self, job: Job) -> float | None:
        """Seconds ``job`` may still wait to start decoding (None: no bound)."""
        bound = self.config.max_queue_wait_s
        return bound - (time.monotonic() - job.admitted) if bound else None

    def shed(self, job: Job) -> Overloaded | None:
        """``job`` has waited ``max_queue_wait_s``: if it is still waiting it leaves the
        queue, refused — the :class:`Overloaded` to answer it with; None once it has started
        (or ended), which it then finishes as it would have."""
        with self._lock:
            return self._shed(job) if job.state == "waiting" else None

    def _shed(self, job: Job) -> Overloaded:
        """(Under ``_lock``, ``job`` waiting.)"""
        job.state = "shed"
        self.metrics.waiting.dec()
        self._load.leave()
        self.metrics.rejected.labels("queue_wait").inc()
        waited = time.monotonic() - job.admitted
        log.info("request shed after %.1fs in the queue without starting", waited)
        return Overloaded.queued_too_long(waited, self.config.max_queue_wait_s)

    def end(self, job: Job) -> None:
        """``job`` has stopped decoding (finished or stopped)."""
        with self._lock:
            job.state = "done"
            self.metrics.running.dec()
            self._load.leave()

    def abandon(self, job: Job) -> None:
        """The client is gone: stop ``job`` (idempotent; no effect once it has finished).

        A waiting job leaves the queue now; a decoding one stops after its current step."""
        job.cancel.set()
        with self._lock:
            if job.state != "waiting":
                return
            job.state = "abandoned"
            self.metrics.waiting.dec()
            self._load.leave()
        self.metrics.abandoned.labels("waiting").inc()
        log.info("request abandoned while waiting for the decode thread")

    def refuse(self, job: Job) -> APIError:
        """The decoder closed before ``job`` reached it (a ``close`` raced its admission): it
        leaves the queue, never decoded; the 503 to answer it with."""
        with self._lock:
            if job.state == "waiting":
                job.state = "refused"
                self.metrics.waiting.dec()
                self._load.leave()
        return shutting_down()

    def concurrency(self, job: Job) -> float:
        """Mean requests in flight on this replica since ``job`` was admitted."""
        with self._lock:
            return self._load.mean_since(job.mark) if job.mark is not None else 1.0

    def k_for(self, job: Job, version: ServedVersion) -> int:
        """Draft tokens for ``job`` at the load it starts under: the bands of the
        controller's policy if it set any, else this replica's config's."""
        k, bands = version.engine.k, self.versions.serving_bands
        return k if bands is None or not k else min(k, bands.k_for(job.in_flight))

    async def generate(self, p: Prepared) -> Served:
        """Decode ``p`` to the end (:meth:`Decoder.generate`); if the caller is cancelled
        (client gone), the request leaves the queue or stops decoding, and is not logged."""
        return await self.decoder.generate(self, p)

    def stream(self, p: Prepared) -> Streamed:
        """Admit ``p`` now (an overload raises here); it decodes as the result is iterated.

        Iterating yields each step's new token ids, then the :class:`Served` request. If the
        consumer stops early, or :meth:`Streamed.abandon` is called (client gone, even before
        iterating), the request leaves the queue or stops decoding after its current step.
        """
        return self.decoder.stream(self, p)

    def report(self, p: Prepared, s: Served) -> None:
        """Metrics and one traffic row per choice: each is a sequence the target decoded
        with the speculator, with its own acceptance."""
        for index, result in enumerate(s.choices):
            self._report(p, replace(s, result=result, extra=[], index=index))

    def _report(self, p: Prepared, s: Served) -> None:
        stats = s.result.stats
        self.metrics.observe_request(version=s.version.name, route=p.ctx.route, stats=stats,
                                     latency_s=s.latency_s, ttft_s=s.ttft_s,
                                     finish_reason=s.result.finish_reason)
        if self.writer is not None:
            self.writer.record(self._record(p, s))

    def _record(self, p: Prepared, s: Served) -> store.RequestRecord:
        """The traffic row of a finished request (see the module doc)."""
        stats = s.result.stats
        keep = p.ctx.log_text
        params = p.params
        return store.RequestRecord(
            prompt_text=p.prompt_text if keep else None,
            output_text=s.result.text if keep else None,
            prompt_ids=p.prompt_ids if keep else None,
            output_ids=s.result.token_ids if keep else None,
            segment=p.ctx.segment if keep else p.ctx.route,  # a label is client text too
            deployment=self.config.deployment,
            speculator_version=s.version.name, opted_out=not keep,
            temperature=params.temperature,
            sampling=self._sampling(p, s),
            finish_reason=s.result.finish_reason,
            latency_ms=s.latency_s * 1e3, ttft_ms=s.ttft_s * 1e3,
            num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens,
            accepted_per_position=list(stats.accepted_per_position),
            prompt_tokens=stats.prompt_tokens, output_tokens=stats.output_tokens,
        )


    def _sampling(self, p: Prepared, s: Served) -> dict[str, Any]:
        """The row's ``sampling``: the request's settings, the k and load it was decoded at,
        and ``banded`` when a concurrency band drafted fewer tokens than the version's k
        (:func:`autospec.serve.bands.drafted_fewer`)."""
        params = p.params
        out = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
               "top_k": params.top_k, "top_p": params.top_p, "seed": params.seed,
               "stop": list(params.stop), "ignore_eos": params.ignore_eos,
               "k": s.version.engine.k if s.k is None else s.k, "route": p.ctx.route,
               "concurrency": round(s.concurrency, 3), "in_flight": s.in_flight,
               **shaping(params), **end_user(p.ctx), **self.decoder.record(p, s)}
        if p.held_out:
            out[HOLDOUT_KEY] = True
        if drafted_fewer(s.version.engine.k, k=s.k, bands=out.get("k_bands"),
                         in_flight=s.in_flight, concurrency=s.concurrency, n=p.n):
            out["banded"] = True
        return out


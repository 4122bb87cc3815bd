"""``LLMServer``: the deployment's core, a plain class testable without Ray.

It turns OpenAI-shaped requests into engine calls, one replica's worth:

- **Concurrency.** The engine decodes one request at a time, synchronously, on the CPU or
  GPU. Each server owns one decode thread (a single-worker executor); requests queue for it
  while the event loop stays free for other requests, health checks and metrics.
  Tokenization runs in the default thread pool. At most ``max_pending_requests`` requests
  may be admitted (waiting or decoding); the next one gets a fast 503 (``Retry-After``).
- **Versions.** A request reads :attr:`VersionManager.current` once, when admitted, and
  decodes with that version's engine to the end (see :mod:`autospec.serve.versions`).
- **Reporting.** When a request finishes, its :class:`RequestStats` go to the metrics
  (:mod:`autospec.serve.metrics`) and, unless traffic logging is off, one
  :class:`~autospec.store.RequestRecord` goes to the traffic writer, whose ``record`` only
  enqueues. The row holds the prompt and output token ids exactly as the target produced
  them (EOS and stop-string tokens included), the texts, the sampling parameters, the
  version, latency and TTFT from arrival, and the acceptance figures. A caller that sent
  ``x-autospec-log: off`` is recorded with ``opted_out``, under its route rather than its
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
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from autospec import store
from autospec.engine.generate import GenerationResult
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target, load_target
from autospec.numerics import record_served
from autospec.serve.config import ServeConfig
from autospec.serve.errors import APIError
from autospec.serve.load import InFlight, Mark
from autospec.serve.metrics import ServeMetrics
from autospec.serve.schemas import ChatCompletionRequest, CompletionRequest, _Request
from autospec.serve.versions import ServedVersion, VersionManager

log = logging.getLogger(__name__)

_GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (as vLLM does)


@dataclass
class RequestContext:
    """Where a request came from and what the caller asked about logging."""

    route: str  # "completions" or "chat"
    segment: str
    log_text: bool = True
    arrived: float = field(default_factory=time.perf_counter)


@dataclass
class Prepared:
    """A validated request, tokenized, bound to the version it will be served by."""

    ctx: RequestContext
    prompt_ids: list[int]
    prompt_text: str | None
    params: SamplingParams
    version: ServedVersion
    n: int = 1  # choices (engine vllm)
    logprobs: int | None = None  # alternatives per token wanted (None: no logprobs)
    #: vLLM's OpenAI layer: the settings beyond autospec's, what replay cannot apply and the
    #: logprobs asked (:mod:`autospec.serve.vllm_openai`)
    vllm: dict[str, Any] | None = None


@dataclass(frozen=True)
class PositionLogprobs:
    """One generated token's log-probability and the likeliest alternatives at its place."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Served:
    """A finished request: ``result`` is its (first) choice; ``extra`` the others (n > 1);
    ``logprobs`` one list per choice when the client asked for them."""

    version: ServedVersion
    result: GenerationResult
    latency_s: float
    ttft_s: float
    extra: list[GenerationResult] = field(default_factory=list)
    logprobs: list[list[PositionLogprobs]] | None = None
    #: the versions that drafted, when more than ``version`` did (a swap mid-request)
    drafted_by: list[str] = field(default_factory=list)
    #: mean requests in flight on the replica during this one's life (:mod:`.load`)
    concurrency: float = 1.0
    in_flight: int = 1  # requests in flight when it started decoding (itself included)
    k: int | None = None  # draft tokens per step it was decoded with (None: the engine's)

    @property
    def choices(self) -> list[GenerationResult]:
        return [self.result, *self.extra]


class Job:
    """One admitted request's place on the decode thread: ``waiting`` -> ``running`` ->
    ``done``, or ``abandoned`` while waiting. Its admission is released exactly once, by
    whichever path ends it; ``cancel`` is the flag the decode thread reads after each step."""

    def __init__(self) -> None:
        self.state = "waiting"
        self.cancel = threading.Event()
        self.steps = 0  # decode steps completed (read by logs and tests)
        self.mark: Mark | None = None  # where it entered the replica's load
        self.in_flight = 1  # requests in flight when it started decoding (itself included)


class Streamed:
    """A streamed request (an async iterator): iterate it for token-id steps then :class:`Served`;
    :meth:`abandon` frees it whether or not iteration ever started."""

    def __init__(self, steps: AsyncIterator[list[int] | Served],
                 abandon: Callable[[], None]) -> None:
        self._steps, self.abandon = steps, abandon

    def __aiter__(self) -> Streamed:
        return self

    async def __anext__(self) -> list[int] | Served:
        return await anext(self._steps)


class Overloaded(APIError):
    def __init__(self, limit: int) -> None:
        super().__init__(503, f"server overloaded: {limit} requests already pending on this "
                         "replica; retry shortly", type="overloaded_error", code="overloaded",
                         headers={"Retry-After": "1"})


class LLMServer:
    """One replica: a target, its versions, a decode thread, metrics and the traffic writer."""

    def __init__(self, target: Target, versions: VersionManager, *, config: ServeConfig,
                 writer: store.TrafficWriter | None = None,
                 metrics: ServeMetrics | None = None) -> None:
        self.target, self.versions, self.config = target, versions, config
        self.writer = writer
        self.metrics = metrics or ServeMetrics()
        self.model_name = config.served_model_name
        self.created = int(time.time())
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autospec-decode")
        self._lock = threading.Lock()
        self._load = InFlight()  # admitted and not finished, over time; guarded by _lock
        self._closed = False
        versions.on_swap = self._on_swap
        versions.on_failure = lambda _version, _reason: self.metrics.load_failures.inc()
        cur = versions.current
        self.metrics.set_version(cur.name, cur.kind)
        if writer is not None:
            store.register_prometheus(writer, registry=self.metrics.registry)

    @classmethod
    def from_config(cls, config: ServeConfig, *, actor: str = "serve") -> LLMServer:
        """Load the target, open the store, record what this deployment serves (target,
        revision, dtype: :mod:`autospec.numerics`), load the live version, start watching."""
        target = load_target(config.target, dtype=config.dtype, device=config.device)
        need_db = config.log_traffic or config.speculation == "live"
        db = store.open_store(config.database_url) if need_db else None
        if db is not None:
            record_served(db, deployment=config.deployment, spec=config.target, target=target,
                          actor=actor)
        writer = store.TrafficWriter(db) if (db is not None and config.log_traffic) else None
        versions = VersionManager(target=target, db=db, deployment=config.deployment,
                                  k=config.speculator_k, speculation=config.speculation == "live",
                                  poll_interval_s=config.poll_interval_s,
                                  report_interval_s=config.report_interval_s, actor=actor,
                                  bands=config.bands)
        server = cls(target, versions, config=config, writer=writer)
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
        self._decoder.shutdown(wait=True)
        if self.writer is not None:
            self.writer.close()

    @property
    def _pending(self) -> int:
        """Requests admitted and not finished (waiting or decoding)."""
        return self._load.count

    def _on_swap(self, old: ServedVersion, new: ServedVersion) -> None:
        self.metrics.set_version(new.name, new.kind, old.name, old.kind)

    def install_routes(self, app: Any) -> bool:
        """Add this engine's own chat and completion routes to the FastAPI ``app``; False:
        it has none, and autospec's (:mod:`autospec.serve.http`) serve it."""
        return False

    # -- health ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``ok`` is False when this replica cannot serve; the rest explains."""
        cur = self.versions.current
        problems = []
        if self._closed:
            problems.append("server closed")
        if not self.versions.watching:
            problems.append("live-pointer watcher stopped")
        return {"ok": not problems, "problems": problems, "version": cur.name,
                "kind": cur.kind, "pending": self._pending,
                "live_pointer_error": self.versions.last_poll_error,
                "load_failures": self.versions.load_failures,
                "traffic": self.writer.counters.as_dict() if self.writer else None}

    # -- preparing requests ------------------------------------------------------------------

    async def prepare_completion(self, req: CompletionRequest, ctx: RequestContext) -> Prepared:
        self._check_model(req.model)
        if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
            ids = self._checked_ids(req.prompt)  # type: ignore[arg-type]
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

        ids, text = await asyncio.to_thread(render)
        return self._bind(ctx, ids, text, req, req.requested_max_tokens)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                           f"{self.model_name!r}", type="not_found_error", param="model",
                           code="model_not_found")

    def _checked_ids(self, ids: list[int]) -> list[int]:
        vocab = self.target.info.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise APIError(400, f"prompt: token id {bad} is outside the vocabulary [0, {vocab})",
                           param="prompt", code="invalid_value")
        return list(ids)

    def _bind(self, ctx: RequestContext, ids: list[int], text: str | None, req: _Request,
              max_tokens: int | None) -> Prepared:
        self.check_features(req)
        version = self.versions.current  # the version this request is served by, to the end
        params = self._params(req, max_tokens, len(ids), version)
        version.engine.check_request(ids, params)  # RequestError -> 400
        return Prepared(ctx, ids, text, params, version, n=req.n, logprobs=req.wanted_logprobs)

    def check_features(self, req: _Request) -> None:
        """A 400 for what this engine does not serve: autospec's engine decodes one choice
        without log-probabilities (the vLLM engine serves both)."""
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
            raise APIError(400, f"max_tokens must be between 1 and {limit}, got {max_tokens}",
                           param="max_tokens", code="invalid_value")
        temperature = 0.0 if req.temperature < _GREEDY_BELOW else req.temperature
        return SamplingParams(max_new_tokens=max_tokens, temperature=temperature,
                              top_k=max(0, req.top_k), top_p=req.top_p,
                              seed=None if req.seed is None else req.seed % 2**64,
                              stop=req.stop_strings, ignore_eos=req.ignore_eos,
                              logit_bias=self._checked_bias(req.bias),
                              presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty)

    def _checked_bias(self, bias: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        vocab = self.target.info.vocab_size
        bad = next((t for t, _ in bias if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"logit_bias: token id {bad} is outside the vocabulary "
                           f"[0, {vocab})", param="logit_bias", code="invalid_value")
        return bias

    # -- decoding ----------------------------------------------------------------------------

    def _admit(self) -> Job:
        if self._closed:
            raise APIError(503, "server is shutting down", type="overloaded_error",
                           code="unavailable")
        with self._lock:
            if self._pending >= self.config.max_pending_requests:
                self.metrics.rejected.labels("pending_limit").inc()
                raise Overloaded(self.config.max_pending_requests)
            self.metrics.waiting.inc()
            job = Job()
            job.mark = self._load.enter()
        return job

    def _start(self, job: Job) -> bool:
        """On the decode thread: take ``job`` off the queue; False if it was abandoned."""
        with self._lock:
            if job.state != "waiting":
                return False
            job.state = "running"
            job.in_flight = self._load.count
            self.metrics.waiting.dec()
            self.metrics.running.inc()
            return True

    def _finish(self, job: Job) -> None:
        """On the decode thread: ``job`` has left the decode thread (finished or stopped)."""
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
        """Decode ``p`` to the end on the decode thread; if the caller is cancelled (client
        gone), the request leaves the queue or stops decoding, and is not logged."""
        job = self._admit()
        loop = asyncio.get_running_loop()
        try:
            served = await loop.run_in_executor(self._decoder, self._decode, p, job, None)
        except asyncio.CancelledError:
            self.abandon(job)
            raise
        assert served is not None
        return served

    def stream(self, p: Prepared) -> Streamed:
        """Admit ``p`` now (an overload raises here); it decodes as the result is iterated.

        Iterating yields each step's new token ids, then the :class:`Served` request. If the
        consumer stops early, or :meth:`Streamed.abandon` is called (client gone, even before
        iterating), the request leaves the queue or stops decoding after its current step.
        """
        job = self._admit()
        return Streamed(self._stream(p, job), lambda: self.abandon(job))

    async def _stream(self, p: Prepared, job: Job) -> AsyncIterator[list[int] | Served]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[int] | Served | BaseException | None] = asyncio.Queue()

        def on_step(ids: list[int]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ids)

        def work() -> None:
            try:
                item: Any = self._decode(p, job, on_step)
            except BaseException as exc:
                item = exc
            loop.call_soon_threadsafe(queue.put_nowait, item)

        loop.run_in_executor(self._decoder, work)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
                if isinstance(item, Served) or item is None:
                    return
        finally:
            self.abandon(job)

    def _decode(self, p: Prepared, job: Job,
                on_step: Callable[[list[int]], None] | None) -> Served | None:
        """On the decode thread: run the engine, then report. None if abandoned."""
        if not self._start(job):
            return None
        try:
            started = time.perf_counter()
            k = self.k_for(job, p.version)
            gen = p.version.engine.stream(p.prompt_ids, p.params, k=k)
            for ids in gen:
                if on_step is not None:
                    on_step(ids)
                if job.cancel.is_set():
                    gen.steps.close()  # type: ignore[attr-defined]
                    self.metrics.abandoned.labels("decoding").inc()
                    log.info("request abandoned after %d steps of decoding", job.steps + 1)
                    return None
                job.steps += 1
            assert gen.result is not None
            result = gen.result
            ended = time.perf_counter()
            served = Served(p.version, result, latency_s=ended - p.ctx.arrived,
                            ttft_s=started - p.ctx.arrived + result.stats.ttft_s,
                            concurrency=self.concurrency(job), in_flight=job.in_flight, k=k)
            self._report(p, served)
            return served
        finally:
            self._finish(job)

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
            sampling={"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                      "top_k": params.top_k, "top_p": params.top_p, "seed": params.seed,
                      "stop": list(params.stop), "ignore_eos": params.ignore_eos,
                      "k": s.version.engine.k if s.k is None else s.k, "route": p.ctx.route,
                      "concurrency": round(s.concurrency, 3), "in_flight": s.in_flight,
                      **_shaping(params)},
            finish_reason=s.result.finish_reason,
            latency_ms=s.latency_s * 1e3, ttft_ms=s.ttft_s * 1e3,
            num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens,
            accepted_per_position=list(stats.accepted_per_position),
            prompt_tokens=stats.prompt_tokens, output_tokens=stats.output_tokens,
        )


def _shaping(params: SamplingParams) -> dict[str, Any]:
    """The row's logit bias and penalties, when a request set them (replay applies them)."""
    out: dict[str, Any] = {}
    if params.logit_bias:
        out["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    if params.presence_penalty:
        out["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        out["frequency_penalty"] = params.frequency_penalty
    return out

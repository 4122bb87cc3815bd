"""One training run, end to end: window -> candidate artifact -> registered version.

:func:`train_candidate` does, in order:

1. checks the input before anything is recorded: the target must be what the deployment's
   replicas serve (:func:`autospec.numerics.check_target`: id, revision, dtype;
   :class:`~autospec.numerics.NumericsMismatch` otherwise), the incumbent to warm-start from (the
   ``--incumbent`` version, else the deployment's live version when it is of the same
   kind, else the newest *base* version of the kind for this target — ``autospec
   pretrain`` —) must be loadable for this target, its artifact the one registered
   (:class:`IncumbentMismatch` otherwise), and the
   window must hold at least ``min_requests`` training requests (:class:`EmptyWindow`,
   :class:`WindowTooSmall`), and the new speculator's config (``request.overrides`` over the
   incumbent's or the kind's) must validate and fit the target (:func:`starting_point`,
   :class:`TrainingInputError`); synthetic sequences of this target join the train part at
   ``request.synthetic``'s share (:func:`~autospec.train.data.mix_synthetic`);
2. closes the runs of this host whose process died (:mod:`autospec.train.dead_runs`), then
   records a ``training_runs`` row (status ``running``, window, config, the process);
3. fits the candidate as its kind declares (:mod:`autospec.train.kinds`): a kind fit from
   documents (``suffix``) indexes the window's requests; a kind trained by gradient
   (``eagle3``, ``draft``) extracts target features (:mod:`autospec.train.features`) and runs
   its recipe in the plain loop in this process (``workers=0``) or on Ray Train workers
   (:mod:`autospec.train.ray_trainer`);
4. writes the artifact (safetensors + config + manifest with SHA-256) into a temporary
   directory under the artifact dir, then in one transaction renames it to
   ``<artifact dir>/<version>``, registers the version as a ``candidate`` (parent, window,
   metrics) and closes the run as ``succeeded`` with its loss curve and examples seen
   (:mod:`autospec.train.register`).

Any failure or interruption (an exception, Ctrl-C, ``should_stop`` returning True — raised
as :class:`TrainingStopped`, by the loop or by the Ray run's driver —, a Ray run that runs out
of retries) after step 2 closes the run as ``failed`` with the reason, removes the partial
artifact and registers nothing; the error is re-raised (a run whose registering COMMIT landed
though it raised stays ``succeeded``, its version registered). A run killed outright
(SIGKILL) cannot: the next run on its host closes it and removes its artifact (step 2), as a
controller does for its own dead cycle's runs.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from autospec import store
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.evaluate.compare import set_tau
from autospec.evaluate.replay import ReplayRequest, replay_request
from autospec.numerics import check_target
from autospec.settings import get_settings
from autospec.speculators import registry
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import KindConfig
from autospec.speculators.kind import FitTraining
from autospec.speculators.registry import build_speculator, target_arch_hints
from autospec.store.retry import retrying
from autospec.threads import ThreadSetting, resolve_threads, torch_threads
from autospec.train.data import (
    SyntheticMix,
    TrainingData,
    TrainSequence,
    WindowSpec,
    documents,
    load_training_data,
    mix_synthetic,
)
from autospec.train.dead_runs import sweep_dead_runs, this_process
from autospec.train.errors import IncumbentMismatch, TrainingInputError, TrainingStopped
from autospec.train.features import FeatureCache, cached_extract
from autospec.train.kinds import TraineeOptions, gradient, training_of
from autospec.train.loop import LoopConfig, LoopState, StepMetrics, evaluate, train_loop
from autospec.train.register import register_candidate
from autospec.versions import VersionLoadError, load_speculator_version

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class TrainRequest:
    """What to train, on which traffic, how."""

    kind: str
    window: WindowSpec = field(default_factory=WindowSpec)
    epochs: int = 3
    workers: int = 0  # 0: this process; N >= 1: Ray Train with N workers
    from_scratch: bool = False
    incumbent: str | None = None  # version to warm-start from (default: live, same kind)
    deployment: str = "default"
    min_requests: int = 1  # the policy minimum of training requests
    seed: int = 0
    batch_size: int = 8
    lr: float | None = None  # None: the kind's default
    loss: str = "kl"
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields of a new speculator
    use_gpu: bool = False
    max_failures: int = 1
    storage_path: Path | None = None  # Ray run storage (default: <data dir>/ray-train)
    fail_at_step: int | None = None  # fault injection for tests and drills (Ray only)
    feature_cache_dir: Path | None = None  # reuse target features across runs on one window
    artifact_dir: Path | None = None  # where the artifact goes (default: the settings')
    precision: str = "auto"  # fp32, bf16 (autocast) or auto: bf16 on CUDA / CPUs with bf16
    time_budget_s: float | None = None  # features + training end within this (gradient kinds)
    feature_noise: float = 0.2  # eagle3: training noise on target features (x layer RMS)
    synthetic: SyntheticMix | None = None  # synthetic sequences mixed into the train part
    cycle_id: str | None = None  # the controller cycle asking (its recovery closes its runs)
    #: cap on torch CPU threads (autospec/threads.py: a count or "auto") of the fit in this
    #: process and, shared out per node, of its Ray workers; None: no cap
    threads: ThreadSetting | None = None

    def __post_init__(self) -> None:
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise TrainingInputError(f"the learning rate (--lr) must be a positive number, "
                                     f"got {self.lr}")


@dataclass
class TrainOutcome:
    version: str
    run_id: int
    artifact: Path
    sha256: str
    parent: str | None
    metrics: dict[str, Any]


class Progress:
    """Progress callbacks (the CLI draws them with rich); the default logs."""

    def phase(self, name: str, total: int | None) -> None:
        log.info("%s (%s)", name, total)

    def advance(self, n: int = 1) -> None:
        pass

    def step(self, metrics: StepMetrics) -> None:
        pass


def train_candidate(request: TrainRequest, *, engine: Engine, target: Target,
                    progress: Progress | None = None, data: TrainingData | None = None,
                    should_stop: Callable[[], bool] | None = None) -> TrainOutcome:
    """Train, write and register one candidate; see the module docstring. ``data``: the
    window's (:func:`load_training_data`) where the caller read it before loading the target."""
    progress = progress or Progress()
    training_of(request.kind)  # a trainable kind, else TrainingInputError naming them
    check_target(engine, deployment=request.deployment, target=target)
    with store.session_scope(engine) as session:
        parent = _incumbent_version(session, request, target)
        if data is None:
            data = load_training_data(session, request.window, min_requests=request.min_requests)
        if request.synthetic is not None:
            data = mix_synthetic(session, data, request.synthetic, synthetic_target(target))
    incumbent = _load_incumbent(engine, parent, target, request.deployment) if parent else None
    return train_on(request, data, engine=engine, target=target, parent=parent,
                    incumbent=incumbent, progress=progress, should_stop=should_stop)


def train_on(request: TrainRequest, data: TrainingData, *, engine: Engine, target: Target,
             parent: str | None = None, incumbent: SavableSpeculator | None = None,
             progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
             meta: dict[str, Any] | None = None) -> TrainOutcome:
    """Record a run, fit on ``data``, write and register the version (``meta`` added to its
    registry row); a failure closes the run as failed and registers nothing."""
    progress = progress or Progress()
    start = starting_point(request, target, incumbent)  # refused here: nothing recorded
    sweep_dead_runs(engine, request.artifact_dir or get_settings().resolved_artifact_dir)
    with store.session_scope(engine) as session:
        run_id = store.start_training_run(
            session, kind=request.kind, parent_version=parent, window_start=data.start,
            window_end=data.end, train_requests=len(data.train) - data.synthetic,
            heldout_requests=len(data.heldout),
            config={**_jsonable(request), "process": this_process()}).id
    try:
        cap = None if request.threads is None else resolve_threads(request.threads)
        with torch_threads(cap):
            spec, metrics = fit(request, data, target, incumbent, progress, should_stop,
                                start=start)
        metrics = {**metrics, "window": data.describe(), "parent": parent}
        version, final, sha = register_candidate(
            engine, spec, target, kind=request.kind, artifact_dir=request.artifact_dir,
            metrics=metrics, run_id=run_id, parent=parent, meta=meta or {})
        return TrainOutcome(version=version, run_id=run_id, artifact=final, sha256=sha,
                            parent=parent, metrics=metrics)
    except BaseException as exc:
        _record_failure(engine, run_id, exc)
        raise


def base_version(session, kind: str, target: Target) -> str | None:  # type: ignore[no-untyped-def]
    """The newest registered *base* version of ``kind`` (``autospec pretrain``) for
    ``target``'s id and revision, or None."""
    from sqlalchemy import select

    from autospec.store.models import Speculator

    info = target.info
    bases = session.scalars(  # in SQL: however many other versions of the kind are newer
        select(Speculator).where(
            Speculator.kind == kind, Speculator.target_id == info.target_id,
            Speculator.meta["base"].as_boolean().is_(True),
            Speculator.state.not_in(("rejected", "rolled_back")))
        .order_by(Speculator.created_at.desc()))
    for row in bases:
        if not row.target_revision or info.accepts_revision(row.target_revision):
            return row.version
    return None


def synthetic_target(target: Target) -> store.SyntheticTarget:
    """The identity synthetic rows must carry to be used with ``target``."""
    return store.SyntheticTarget(target_id=target.info.target_id,
                                 revision=target.info.revision, dtype=target.dtype_name)


def _incumbent_version(session, request: TrainRequest, target: Target) -> str | None:  # type: ignore[no-untyped-def]
    """``--incumbent``, else the live version if of this kind, else the base version of
    this kind for the target (``autospec pretrain``), else None (from scratch)."""
    if request.from_scratch:
        return None
    if request.incumbent:
        row = store.get_speculator(session, version=request.incumbent)
        if row.kind != request.kind:
            raise IncumbentMismatch(f"incumbent {row.version} is a {row.kind} speculator, "
                                    f"not {request.kind}")
        return row.version
    live = store.get_live(session, deployment=request.deployment)
    if live is not None:
        row = store.get_speculator(session, version=live.version)
        if row.kind == request.kind:
            return row.version
    return base_version(session, request.kind, target)


def _load_incumbent(engine: Engine, version: str, target: Target,
                    deployment: str) -> SavableSpeculator:
    with store.session_scope(engine, readonly=True) as session:
        row = store.get_speculator(session, version=version)
        target_id, revision = row.target_id, row.target_revision
        base = bool((row.meta or {}).get("base"))
    info = target.info
    if target_id != info.target_id or (revision and not info.accepts_revision(revision)):
        raise IncumbentMismatch(
            f"incumbent {version} was built for target {target_id!r} (revision {revision}), "
            f"not {info.target_id!r} (revision {info.revision}); train with --from-scratch")
    try:  # the shared loader: checksums, the registered SHA-256 (audited), the target; in
        # float32, so training starts from the stored weights, not their bfloat16 rounding
        kind, spec = load_speculator_version(engine, target, version, actor="train",
                                              deployment=deployment, float32=True)
    except VersionLoadError as exc:
        raise IncumbentMismatch(f"cannot warm-start from {version}: {exc}") from exc
    assert isinstance(spec, SavableSpeculator)
    training = training_of(kind)
    if base and not isinstance(training, FitTraining):
        training.recipe.adopt_base(spec)
    return spec


# -- fitting --------------------------------------------------------------------------------
def starting_point(request: TrainRequest, target: Target, incumbent: SavableSpeculator | None,
                   ) -> KindConfig | SavableSpeculator:
    """What the fit starts from: the incumbent's config (a warm start), else the kind's for
    ``target``, with ``request.overrides`` validated by the kind's config model; a kind
    trained by gradient gets it built (checked against ``target``: hidden size, feature
    layers...). :class:`TrainingInputError` naming what does not fit."""
    overrides = request.overrides
    try:
        if incumbent is not None:
            base = incumbent.config
            config = type(base).model_validate({**base.model_dump(), **overrides})
        else:
            entry = registry.kind(request.kind)
            values = {**target_arch_hints(target), **overrides} if entry.has_layers \
                else overrides
            config = entry.config.for_target(target.info, **values)
        if isinstance(training_of(request.kind), FitTraining):
            return config
        return build_speculator(config, target)
    except ValueError as exc:  # pydantic's ValidationError too
        text = " ".join(str(exc).split("\n")[:3]) if isinstance(exc, ValidationError) \
            else str(exc)
        raise TrainingInputError(f"the {request.kind} config does not fit the target "
                                 f"{target.info.target_id}: {text}") from None


def fit(request: TrainRequest, data: TrainingData, target: Target,
        incumbent: SavableSpeculator | None, progress: Progress,
        should_stop: Callable[[], bool] | None = None, *,
        start: KindConfig | SavableSpeculator | None = None) -> tuple[SavableSpeculator, dict]:
    """The trained speculator and its metrics (nothing is written or registered); ``start``:
    :func:`starting_point`'s (default: made here)."""
    if start is None:
        start = starting_point(request, target, incumbent)
    torch.manual_seed(request.seed)
    training = training_of(request.kind)
    if isinstance(training, FitTraining):
        assert isinstance(start, KindConfig)
        return _fit_documents(training, request, data, target, start)
    assert isinstance(start, SavableSpeculator)
    return _fit_gradient(request, data, target, incumbent, start, progress, should_stop)


def _fit_documents(training: FitTraining, request: TrainRequest, data: TrainingData,
                   target: Target, config: KindConfig) -> tuple[SavableSpeculator, dict]:
    started = time.perf_counter()
    spec, built = training.fit(config, documents(data.train), target)
    metrics = {**built, "build_s": time.perf_counter() - started,
               "examples_seen": len(data.train)}
    if data.heldout and (tau := replay_tau(spec, data.heldout, k=5)) is not None:
        metrics["heldout_replay_tau_k5"] = tau  # absent: no held-out step to measure
    return spec, metrics


def _fit_gradient(request: TrainRequest, data: TrainingData, target: Target,
                  incumbent: SavableSpeculator | None, spec: SavableSpeculator,
                  progress: Progress,
                  should_stop: Callable[[], bool] | None) -> tuple[SavableSpeculator, dict]:
    recipe = gradient(request.kind).recipe
    started = time.perf_counter()
    init = recipe.prepare(spec, data.train, target, incumbent)
    layers = spec.feature_layers if recipe.feature_layers_needed else ()
    where = request.feature_cache_dir
    train_cache = _extract(target, data.train, layers, progress, "target features (train)", where)
    held = _extract(target, data.heldout, layers, progress, "target features (held out)", where)
    feature_s = time.perf_counter() - started
    opts = TraineeOptions(ttt_steps=getattr(spec.config, "ttt_steps", 1), loss=request.loss,
                          eos_ids=tuple(target.info.eos_token_ids),
                          feature_noise=request.feature_noise)
    trainee = recipe.trainee(spec, opts)
    before = evaluate(trainee, held) if held is not None else None
    lr = gradient(request.kind).lr if request.lr is None else request.lr  # 0 is no default
    loop = LoopConfig(epochs=request.epochs, batch_size=request.batch_size, lr=lr,
                      seed=request.seed,
                      precision=resolve_precision(request.precision, target),
                      time_budget_s=_loop_budget(request, time.perf_counter() - started))
    started = time.perf_counter()
    if request.workers == 0:
        progress.phase("training", len(data.train) * request.epochs // request.batch_size)
        state = train_loop(trainee, train_cache, loop, on_step=progress.step,
                           should_stop=should_stop)
    else:
        state = _fit_on_ray(request, recipe, spec, trainee, opts, train_cache, loop, progress,
                            should_stop)
    train_s = time.perf_counter() - started
    after = evaluate(trainee, held) if held is not None else None
    built = recipe.finish(spec, data.train, target, incumbent)
    spec.to(target.device)  # fresh per-request state on the right device
    return spec, {**init, **built, "loss_curve": state.loss_curve, "steps": state.step,
                  "examples_seen": state.examples_seen, "epochs": request.epochs,
                  "train_tokens": train_cache.num_tokens, "feature_s": feature_s,
                  "train_s": train_s, "workers": request.workers, "resumes": state.resumes,
                  "heldout_before": before, "heldout_after": after, "loss": request.loss,
                  "lr": loop.lr, "batch_size": loop.batch_size, "precision": loop.precision,
                  "stopped_early": state.stopped_early, "feature_noise": opts.feature_noise}


def resolve_precision(precision: str, target: Target) -> str:
    """``auto`` -> ``bf16`` on CUDA and on CPUs with native bfloat16, else ``fp32``."""
    from autospec.engine.target import pick_dtype
    from autospec.train.loop import check_precision

    check_precision(precision)
    if precision != "auto":
        return precision
    return "bf16" if pick_dtype("auto", target.device) == torch.bfloat16 else "fp32"


def _loop_budget(request: TrainRequest, used_s: float) -> float | None:
    """What is left of the run's budget for the loop (a tenth kept for evaluation and saving)."""
    if request.time_budget_s is None:
        return None
    left = 0.9 * request.time_budget_s - used_s
    if left <= 0:
        raise TrainingStopped(f"the time budget of {request.time_budget_s:.0f}s was used up "
                              f"by feature extraction ({used_s:.0f}s)")
    return left


def _extract(target: Target, seqs: list[TrainSequence], layers: tuple[int, ...],
             progress: Progress, name: str, cache_dir: Path | None) -> FeatureCache | None:
    if not seqs:
        return None
    progress.phase(name, len(seqs))
    return cached_extract(cache_dir, target, seqs, feature_layers=layers,
                          progress=progress.advance)


def _fit_on_ray(request: TrainRequest, recipe, spec: SavableSpeculator, trainee,
                opts: TraineeOptions, cache: FeatureCache, loop: LoopConfig,
                progress: Progress, should_stop: Callable[[], bool] | None) -> LoopState:
    from autospec.train.ray_trainer import ray_fit

    progress.phase(f"training on {request.workers} Ray workers", None)
    storage = request.storage_path or get_settings().data_dir / "ray-train"
    state_tensors, state = ray_fit(
        kind=request.kind, config=spec.config, state=recipe.state_of(trainee),
        shared=recipe.shared(spec), opts=opts, cache=cache, loop=loop,
        workers=request.workers, storage_path=storage,
        name=f"{request.kind}-{uuid.uuid4().hex[:8]}", use_gpu=request.use_gpu,
        max_failures=request.max_failures, fail_at_step=request.fail_at_step,
        threads=request.threads, should_stop=should_stop)
    recipe.load_state(trainee, state_tensors)
    return state


def replay_tau(spec: SavableSpeculator, sequences: list[TrainSequence],
               k: int = 5) -> float | None:
    """τ of a feature-free speculator replayed over logged greedy outputs (exact for greedy;
    :func:`autospec.evaluate.replay.replay_request` counts the steps as the engine takes them);
    None when no output was long enough for a step."""
    stats = []
    for seq in sequences:
        out = seq.ids[seq.prompt_len :]
        req = ReplayRequest(prompt_ids=seq.ids[: seq.prompt_len], output_ids=out,
                            params=SamplingParams(max_new_tokens=max(len(out), 1)))
        stats.append(replay_request(None, spec, req, k))
    return set_tau(stats)


def _record_failure(engine: Engine, run_id: int, exc: BaseException) -> None:
    reason = {KeyboardInterrupt: "interrupted", TrainingStopped: "stopped"}.get(
        type(exc), type(exc).__name__)
    message = f"{reason}: {exc}".strip().rstrip(":")
    def write() -> None:
        with store.session_scope(engine) as session:  # a landed registration stays
            if store.get_training_run(session, run_id=run_id).status == "running":
                store.finish_training_run(session, run_id=run_id, status="failed",
                                          error=message)

    try:  # a store outage is waited out: else the run would stay `running`
        retrying(f"recording the failure of run {run_id}", write)
    except (store.StoreError, SQLAlchemyError) as store_exc:  # the original error matters more
        log.error("could not record the failure of run %d: %s", run_id, store_exc)


def _jsonable(request: TrainRequest) -> dict[str, Any]:
    data = asdict(request)
    data["window"] = request.window.describe()
    for key in ("storage_path", "feature_cache_dir", "artifact_dir"):
        data[key] = str(data[key]) if data[key] is not None else None
    return data

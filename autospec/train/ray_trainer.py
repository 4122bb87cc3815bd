"""A thin Ray Train wrapper: the plain loop of :mod:`autospec.train.loop` on N workers.

:func:`ray_fit` writes a *job* directory under the run's storage (features, initial
weights and the frozen target tensors the kind borrows, all safetensors; hyperparameters
as JSON), then runs :func:`_worker` on ``workers`` Ray workers with ``TorchTrainer``
(``ScalingConfig``: CPU workers here, ``use_gpu=True`` on a GPU cluster). Each worker
rebuilds the trainee from the job (no target needed), wraps it with DDP
(``ray.train.torch.prepare_model``) and calls :func:`~autospec.train.loop.train_loop`
on its share of the batches. After every epoch rank 0 reports a checkpoint (trainee
weights and optimiser state as safetensors, the loop state as JSON; never pickle);
when a worker dies, Ray restarts the group (``FailureConfig(max_failures)``) and the
loop resumes from the latest checkpoint. ``fail_at_step`` injects one such death (for
tests and drills): the first attempt to pass that step raises, later attempts do not.
Once the final checkpoint is read into memory (or the run failed), the run's folder under
the storage — job and checkpoints — is removed: nothing of a run stays on disk (a driver
killed outright cannot: the job names its process, and the next run on the host removes the
folder, :func:`~autospec.train.dead_runs.sweep_dead_ray_storage`).

Stopping on request (``should_stop``: the cycle's deadline, a lost lease): the driver asks it
every half second while it waits for the run (:class:`RunStop`) and, when True, writes a stop
marker into the job. Each worker's loop asks for the marker before each step and the ranks
decide together, in the loop's one all-reduce a step, so all stop before the same step
(ranks stopping apart would hang in DDP's next all-reduce); they end without error and
without a checkpoint, and the driver raises :class:`TrainingStopped` (nothing comes back
to register). A worker also stops when the job is gone. A worker that cannot ask (reading
the job raises: a network filesystem's ``OSError``) ends with the others before the same
step: unless another rank saw the marker, every rank raises
:class:`~autospec.train.errors.StopQuestionFailed`, naming that rank and its error — a
failure of the worker group, as a worker death is (Ray restarts the group from the latest
checkpoint while ``max_failures`` allows, then the run fails with that error).

Ray Train's only abort is the Ctrl-C handler its ``fit`` installs when run from the main
thread (its controller actor's handle stays inside ``fit``), which
:func:`fit_off_the_main_thread` avoids; so a run that has not ended ``stop_grace_s`` after
the marker (a step that hangs, a worker group still waiting for resources) is given up: its
workers are ended, :class:`TrainingStopped` is raised at once and the job removed. Rank 0
names the placement group it runs in (``ray.util.get_current_placement_group``) in the job
as it starts (:func:`note_placement_group`); the driver removes that group
(``ray.util.remove_placement_group``, :func:`end_workers`): Ray kills the worker actors in
it and frees the CPUs (and GPUs) it reserved, and the controller, finding its workers dead,
ends the run (a group it restarts while ``max_failures`` allows fails at once: no job). A
group that never started (still waiting for resources) reserves nothing and named no
placement group; it fails at once should it start later. Ray itself is not shut down for it.

Which Ray (:func:`connect_ray`, called by :func:`ray_fit` and by the CLIs before a run):
the one this process is already a driver of; else the cluster at ``address`` (``autospec
train --address``, ``autospec controller ... --address``) or ``RAY_ADDRESS`` (a ``host:port``
where nothing answers fails within seconds, :mod:`autospec.train.ray_room`); else a new
local Ray (``address="local"``: never a ``ray start`` cluster found on the machine). Nothing
here shuts Ray down: a local Ray started here ends with the process (and serves its later
runs), and a cluster this process only joined is never stopped. On a multi-node cluster
``storage_path`` must be a directory every node sees (a shared filesystem).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from autospec.file_modes import save_safetensors
from autospec.threads import ThreadSetting, worker_threads
from autospec.train.dead_runs import this_process
from autospec.train.errors import TrainingError, TrainingStopped
from autospec.train.features import FeatureCache
from autospec.train.kinds import TraineeOptions, recipe
from autospec.train.loop import LoopConfig, LoopState, train_loop
from autospec.train.ray_room import check_reachable, check_room

log = logging.getLogger(__name__)

STATE_FILE, OPTIM_FILE, LOOP_FILE = "state.safetensors", "optimizer.safetensors", "loop.json"
#: in the job: the driver's request to stop; rank 0's word that the ranks stopped (the step)
STOP_FILE, STOPPED_FILE = "stop-requested", "stopped"
#: in the job: rank 0's word which placement group the workers run in (its hex id)
PLACEMENT_FILE = "placement-group"
#: how long the driver waits for a run to end after it asked it to stop
STOP_GRACE_S = 120.0


def connect_ray(*, address: str | None = None, workers: int = 2) -> str:
    """Make this process a Ray driver; returns what it did: ``"existing"`` (already one),
    ``"connected"`` (joined the cluster at ``address`` or ``RAY_ADDRESS``) or ``"started"``
    (a new local Ray with ``max(2, workers)`` CPUs). A cluster that cannot be reached is a
    :class:`TrainingError`."""
    import ray

    from autospec.rayjoin import join

    if ray.is_initialized():
        return "existing"
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or address == "local":
        from autospec.raylocal import start_local  # loopback unless AUTOSPEC_EXPOSE_RAY

        start_local(num_cpus=max(2, workers), log_to_driver=False, configure_logging=False)
        return "started"
    check_reachable(address)
    try:  # an existing cluster: its resources are its own (no num_cpus here)
        join(address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise TrainingError(f"cannot join the Ray cluster at {address}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc) else exc!r}") from exc
    log.info("joined the Ray cluster at %s", address)
    return "connected"


def ray_fit(*, kind: str, config: Any, state: dict[str, torch.Tensor],
            shared: dict[str, torch.Tensor], opts: TraineeOptions, cache: FeatureCache,
            loop: LoopConfig, workers: int, storage_path: Path, name: str,
            use_gpu: bool = False, max_failures: int = 1,
            fail_at_step: int | None = None, address: str | None = None,
            threads: ThreadSetting | None = None,
            should_stop: Callable[[], bool] | None = None,
            stop_grace_s: float = STOP_GRACE_S) -> tuple[dict[str, torch.Tensor], LoopState]:
    """Train on ``workers`` Ray workers; the final trainee state and loop state.
    ``address``: the Ray cluster to join when this process is not a driver yet (else
    ``RAY_ADDRESS``, else a new local Ray; see :func:`connect_ray`). ``threads``: the cap on
    torch threads, shared out among the workers of each node in the worker itself
    (:func:`~autospec.threads.worker_threads`; None: the node's CPUs shared out).
    ``should_stop`` returning True stops the run (:class:`TrainingStopped`; the module's
    docstring says how, and what ``stop_grace_s`` bounds). The run's folder
    ``storage_path/name`` is removed once its checkpoint is read, or the run failed or
    stopped (:func:`remove_run_storage`)."""
    try:
        return _fit(kind=kind, config=config, state=state, shared=shared, opts=opts,
                    cache=cache, loop=loop, workers=workers, storage_path=storage_path,
                    name=name, use_gpu=use_gpu, max_failures=max_failures,
                    fail_at_step=fail_at_step, address=address, threads=threads,
                    stop=None if should_stop is None else
                    RunStop(should_stop, Path(storage_path).resolve() / name / "job",
                            stop_grace_s))
    finally:  # read or failed, the run's storage is of no further use
        remove_run_storage(storage_path, name)


def remove_run_storage(storage_path: Path, name: str) -> None:
    """Remove run ``name``'s folder under ``storage_path``: its job (a copy of the feature
    cache, the initial weights) and Ray Train's checkpoints and results. What cannot be
    removed is logged, never raised (the run's outcome matters more)."""
    folder = Path(storage_path) / name
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        log.warning("could not remove the Ray Train storage %s of run %s", folder, name)


def _fit(*, kind: str, config: Any, state: dict[str, torch.Tensor],
         shared: dict[str, torch.Tensor], opts: TraineeOptions, cache: FeatureCache,
         loop: LoopConfig, workers: int, storage_path: Path, name: str, use_gpu: bool,
         max_failures: int, fail_at_step: int | None, address: str | None,
         threads: ThreadSetting | None,
         stop: RunStop | None) -> tuple[dict[str, torch.Tensor], LoopState]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    job = Path(storage_path).resolve() / name / "job"  # workers run in folders of their own
    job.mkdir(parents=True, exist_ok=True)
    cache.save(job / "features.safetensors")
    save_safetensors(_contiguous(state), job / "init.safetensors")
    save_safetensors(_contiguous(shared), job / "shared.safetensors")
    (job / "job.json").write_text(json.dumps({
        "kind": kind, "config": config.model_dump(mode="json"), "opts": asdict(opts),
        "loop": asdict(loop), "fail_at_step": fail_at_step,
        "fault_marker": str(job / "fault-injected"), "process": this_process()}))
    connect_ray(address=address, workers=workers)
    check_room(workers, use_gpu, local=not (address or os.environ.get("RAY_ADDRESS")))
    trainer = TorchTrainer(
        _worker, train_loop_config={"job": str(job), "threads": threads},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(Path(storage_path).resolve()),
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    try:
        result = fit_off_the_main_thread(trainer, stop)
    except ray.train.TrainingFailedError as exc:
        raise TrainingError(f"Ray Train run {name} failed: {_root_cause(exc)}") from exc
    if result.checkpoint is None:
        raise TrainingError(f"Ray Train run {name} finished without a checkpoint")
    log.info("Ray Train run %s: rank 0 trained on %s torch threads", name,
             (result.metrics or {}).get("threads"))
    with result.checkpoint.as_directory() as directory:
        return _read_checkpoint(Path(directory))


class RunStop:
    """The driver's half of stopping a Ray run on request. :meth:`poll` (every half second)
    writes the stop marker into ``job`` once ``should_stop()`` is True, and raises
    :class:`TrainingStopped` when the run has not ended ``grace_s`` after that, its workers
    ended first (:func:`end_workers`);
    :meth:`stopped` is the error for a run that ended after the request."""

    def __init__(self, should_stop: Callable[[], bool], job: Path, grace_s: float) -> None:
        self.should_stop, self.job, self.grace_s = should_stop, job, grace_s
        self.asked_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.asked_at is not None

    def poll(self) -> None:
        if self.asked_at is None:
            if self.should_stop():
                (self.job / STOP_FILE).write_text("stop")
                self.asked_at = time.monotonic()
                log.info("asked the Ray Train run to stop (%s)", self.job.parent.name)
        elif time.monotonic() - self.asked_at > self.grace_s:
            ended = end_workers(self.job)
            raise TrainingStopped(
                f"stopped on request; the Ray Train run {self.job.parent.name} had not ended "
                f"{self.grace_s:.0f}s after it was asked to and "
                + ("its workers were ended" if ended else "is left to end by itself"))

    def stopped(self) -> TrainingStopped:
        said = self.job / STOPPED_FILE
        return TrainingStopped(said.read_text() if said.exists()
                               else "stopped on request as the Ray Train run ended")


def note_placement_group(job: Path) -> None:
    """Name in ``job`` the placement group this Ray worker runs in, for :func:`end_workers`.
    Not in one (no Ray Train worker) or not writable: logged, the run goes on."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        log.warning("this Ray worker runs in no placement group: a given-up run cannot end it")
        return
    try:
        (job / PLACEMENT_FILE).write_text(group.id.hex())
    except OSError as exc:
        log.warning("could not name the placement group in the job %s: %s", job, exc)


def end_workers(job: Path) -> bool:
    """End the workers of the run of ``job``: remove the placement group its rank 0 named
    there (:func:`note_placement_group`); Ray kills the actors in it and frees what it
    reserved. False when none was named (no worker started), the one named is already gone
    (a worker group Ray Train restarted has not named its own yet) or it cannot be removed
    (logged): the run is given up all the same."""
    try:
        named = (job / PLACEMENT_FILE).read_text().strip()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not read the placement group of the Ray Train run %s: %s",
                    job.parent.name, exc)
        return False
    import ray
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    try:
        group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(named)))
        state = placement_group_table(group).get("state")
        if state in (None, "REMOVED"):  # a group Ray Train replaced after a worker died
            log.warning("the placement group %s of the Ray Train run %s is %s: its workers "
                        "are not known here", named, job.parent.name, state or "unknown")
            return False
        remove_placement_group(group)
    except Exception as exc:  # a malformed name, Ray gone: given up all the same
        log.warning("could not remove the placement group %r of the Ray Train run %s: %s",
                    named[:80], job.parent.name, exc)
        return False
    log.info("removed the placement group %s of the given-up Ray Train run %s", named,
             job.parent.name)
    return True


def fit_off_the_main_thread(trainer: Any, stop: RunStop | None = None) -> Any:
    """``trainer.fit()`` in a thread of its own, waited for here. Called from the main thread,
    Ray Train's ``fit`` puts its own Ctrl-C handler in place and leaves it there: Ctrl-C then
    aborted the run and exited 0 (a script carried on; ``autospec train`` did not say it was
    interrupted), and in ``controller run`` every later Ctrl-C went to it. From another thread
    it installs none: Ctrl-C stays a ``KeyboardInterrupt`` here (the command exits 130; the
    run, owned by this process, ends with it). ``stop`` is polled while the run goes on; once
    it was asked to stop, however the run ended, :class:`TrainingStopped` is raised."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)  # a join that returns now and then: Ctrl-C interrupts it
        if stop is not None and thread.is_alive():
            stop.poll()
    if stop is not None and stop.requested:
        raise stop.stopped() from outcome.get("error")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _worker(cfg: dict[str, Any]) -> None:
    """One Ray worker: rebuild the trainee, resume if there is a checkpoint, train."""
    import ray.train
    import ray.train.torch

    from autospec.speculators.registry import parse_config

    job = Path(cfg["job"])
    spec = json.loads((job / "job.json").read_text())
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if rank == 0:  # for the driver, should it give the run up
        note_placement_group(job)
    torch.set_num_threads(worker_threads(cfg.get("threads"), ctx.get_local_world_size()))
    fit = recipe(spec["kind"])
    opts = TraineeOptions(**{**spec["opts"], "eos_ids": tuple(spec["opts"]["eos_ids"])})
    trainee = fit.trainee_from_tensors(
        parse_config(spec["config"]), safetensors.torch.load_file(str(job / "init.safetensors")),
        safetensors.torch.load_file(str(job / "shared.safetensors")), opts)
    resume = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state, resume = _read_checkpoint(Path(directory))
        resume.resumes += 1
        fit.load_state(trainee, state)
        log.info("rank %d resumes after epoch %d", rank, resume.epoch)
    model = ray.train.torch.prepare_model(
        trainee, parallel_strategy_kwargs={"broadcast_buffers": False})
    cache = FeatureCache.load(job / "features.safetensors")
    loop = LoopConfig(**spec["loop"])

    def report(state: LoopState) -> None:
        metrics = {"epoch": state.epoch, "step": state.step, "threads": torch.get_num_threads(),
                   "loss": state.loss_curve[-1][1] if state.loss_curve else float("nan")}
        if rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as directory:
            _write_checkpoint(Path(directory), fit.state_of(trainee), state)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def should_stop() -> bool:  # the driver asked, or gave the run up (the job is gone)
        return (job / STOP_FILE).exists() or not (job / "job.json").exists()

    try:
        train_loop(trainee, cache, loop, model=model, rank=rank, world_size=world,
                   resume=resume, on_epoch_end=report, on_step=_fault(spec),
                   should_stop=should_stop)
    except TrainingStopped as exc:  # every rank, before the same step: the run ends cleanly
        log.info("rank %d: %s", rank, exc)
        if rank == 0:
            with contextlib.suppress(OSError):  # no job: the driver gave the run up
                (job / STOPPED_FILE).write_text(str(exc))


def _fault(spec: dict[str, Any]):
    """The fault-injection hook: die once at step ``fail_at_step`` (marker file: once)."""
    step, marker = spec.get("fail_at_step"), Path(spec["fault_marker"])
    if step is None:
        return None

    def maybe_die(metrics) -> None:
        if metrics.step == step and not marker.exists():
            marker.write_text("injected")
            raise RuntimeError(f"injected worker failure at step {step}")

    return maybe_die


def _write_checkpoint(directory: Path, state: dict[str, torch.Tensor], loop: LoopState) -> None:
    save_safetensors(_contiguous(state), directory / STATE_FILE)
    tensors, meta = _flatten_optimizer(loop.optimizer or {})
    save_safetensors(tensors, directory / OPTIM_FILE)
    (directory / LOOP_FILE).write_text(json.dumps({
        "epoch": loop.epoch, "step": loop.step, "examples_seen": loop.examples_seen,
        "loss_curve": loop.loss_curve, "resumes": loop.resumes, "elapsed_s": loop.elapsed_s,
        "stopped_early": loop.stopped_early, "optimizer": meta}))


def _read_checkpoint(directory: Path) -> tuple[dict[str, torch.Tensor], LoopState]:
    state = safetensors.torch.load_file(str(directory / STATE_FILE))
    info = json.loads((directory / LOOP_FILE).read_text())
    optimizer = _unflatten_optimizer(
        safetensors.torch.load_file(str(directory / OPTIM_FILE)), info["optimizer"])
    loop = LoopState(epoch=info["epoch"], step=info["step"], examples_seen=info["examples_seen"],
                     loss_curve=[tuple(p) for p in info["loss_curve"]], optimizer=optimizer,
                     resumes=info.get("resumes", 0), elapsed_s=info.get("elapsed_s", 0.0),
                     stopped_early=info.get("stopped_early", False))
    return state, loop


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer ``state_dict`` as named tensors plus JSON (no pickle)."""
    tensors: dict[str, torch.Tensor] = {}
    for index, values in sd.get("state", {}).items():
        for key, value in values.items():
            tensors[f"{index}.{key}"] = torch.as_tensor(value).contiguous()
    return tensors, {"param_groups": sd.get("param_groups", [])}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict | None:
    if not meta.get("param_groups"):
        return None
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    return {"state": state, "param_groups": meta["param_groups"]}


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def _root_cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    interesting = [line for line in text if "Error" in line or "error" in line]
    return (interesting[-1] if interesting else (text[-1] if text else repr(exc)))[:500]

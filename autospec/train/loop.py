"""The training loop: plain PyTorch, one function, deterministic under a seed.

:func:`train_loop` optimises a trainee (from the kind's recipe: :mod:`autospec.train.kinds`)
over a :class:`~autospec.train.features.FeatureCache` for ``epochs`` epochs with AdamW, a
linear-warmup cosine learning rate (:func:`get_lr`) and gradient clipping. It runs
alone (``world_size=1``) or as one rank of a data-parallel group (the Ray wrapper
passes the DDP-wrapped module as ``model`` and the rank): every rank draws the same
seeded batch order and takes every ``world_size``-th batch, so all ranks run the same
number of steps. ``on_epoch_end`` is where a caller checkpoints; a :class:`LoopState`
given back as ``resume`` continues after its last finished epoch exactly as an
uninterrupted run would. ``precision="bf16"`` runs forward and backward under bfloat16
autocast (weights and optimiser in float32). A ``time_budget_s`` ends the run when it is
used up (the schedule then follows the clock, so the rate still ends low); a run cut short
this way is deterministic only up to where the clock stopped it.

``should_stop`` stops the run on request (:class:`TrainingStopped`, no checkpoint of the
step): alone it is asked after each step; in a group it is asked before each step and its
answer travels in the one all-reduce a step that the clock already does, so a stop any rank
sees stops every rank before the same step (ranks stopping at different steps would wait
for ever in DDP's next all-reduce). The Ray wrapper asks there for the driver's stop marker.
A rank whose ``should_stop`` raises (an ``OSError`` reading the marker on a network
filesystem) still takes its part in that all-reduce, saying so: a stop another rank saw
wins (every rank raises :class:`TrainingStopped`, the failing rank logs its error);
otherwise every rank raises :class:`~autospec.train.errors.StopQuestionFailed` before the
same step, naming the failing rank and its error (one broadcast, only then). Leaving the
loop alone would leave the others waiting in the all-reduce; going on as if asked nothing
would leave the run unstoppable while the question keeps failing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from autospec.train.errors import StopQuestionFailed, TrainingInputError, TrainingStopped
from autospec.train.features import FeatureCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopConfig:
    """Optimisation hyperparameters of one run."""

    epochs: int = 3
    batch_size: int = 8  # sequences per optimiser step (per rank)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 5  # loss curve: one point per this many steps
    precision: str = "fp32"  # "bf16": forward/backward under bfloat16 autocast (fp32 weights)
    time_budget_s: float | None = None  # stop after this long; the schedule follows the clock


@dataclass
class LoopState:
    """Where a run is: finished epochs, steps, the curve so far (checkpointed per epoch)."""

    epoch: int = 0
    step: int = 0
    examples_seen: int = 0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    optimizer: dict | None = None
    resumes: int = 0  # times the run resumed from a checkpoint (a worker died)
    elapsed_s: float = 0.0  # training seconds so far (the time budget's clock)
    stopped_early: bool = False  # the time budget ended the run before its last epoch


@dataclass
class StepMetrics:
    step: int
    epoch: int
    loss: float
    lr: float
    accuracy: list[float]  # top-1 agreement with the target per unrolled step


def get_lr(step: int, total: int, cfg: LoopConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup for ``warmup_steps``, then cosine from ``lr`` to ``lr * min_lr_ratio``.

    With a time budget the cosine's progress is the larger of the step share and the
    budget share used, so a run cut short by its budget still ends at the low rate.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    if cfg.time_budget_s:
        progress = max(progress, min(1.0, elapsed_s / cfg.time_budget_s))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def epoch_batches(lengths: torch.Tensor, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded batches of sequence indices, grouped by similar length, in shuffled order."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(lengths), generator=gen).tolist()
    pool = batch_size * 16  # sort within pools: little padding, still shuffled
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: int(lengths[i]))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    shuffle = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in shuffle]


def _batch_loss(model: nn.Module, trainee: nn.Module, cache: FeatureCache, indices: list[int],
                precision: str, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(loss, correct, counted) of one batch; a loss without a graph names why, instead of
    autograd's 'element 0 of tensors does not require grad'."""
    with _autocast(precision, device):
        loss, correct, counted = model(**trainee.make_batch(cache, indices))
    if not loss.requires_grad:
        raise RuntimeError(
            "the training loss has no autograd graph (autograd enabled: "
            f"{torch.is_grad_enabled()}, inference mode: {torch.is_inference_mode_enabled()}); "
            "no trainable parameter reached it")
    return loss, correct, counted


@torch.inference_mode(False)  # whatever the caller's thread was left in: inference mode
@torch.enable_grad()  # ... or autograd off (either way the loss would have no graph)
def train_loop(
    trainee: nn.Module,
    cache: FeatureCache,
    cfg: LoopConfig,
    *,
    model: nn.Module | None = None,
    rank: int = 0,
    world_size: int = 1,
    resume: LoopState | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_epoch_end: Callable[[LoopState], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LoopState:
    """Train ``trainee`` (through ``model``, its DDP wrapper, if given); the final state."""
    model = model if model is not None else trainee
    params = [p for p in trainee.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.95))
    state = resume or LoopState()
    if state.optimizer is not None:
        optimizer.load_state_dict(state.optimizer)
    lengths = cache.lengths()
    per_epoch = len(epoch_batches(lengths, cfg.batch_size, cfg.seed, 0)) // world_size
    if per_epoch == 0:
        raise ValueError(f"{len(cache)} sequences make no batch for {world_size} ranks")
    total = per_epoch * cfg.epochs
    model.train()
    running, started = [], time.perf_counter()
    clock = _Clock(state.elapsed_s, world_size, params[0].device, rank)
    ask_before = should_stop if clock.shared else None  # a group decides together
    for epoch in range(state.epoch, cfg.epochs):
        # random draws (feature noise, dropout) seeded per epoch: a resumed run repeats them
        torch.manual_seed(cfg.seed * 1_000_003 + epoch * 1_009 + rank)
        batches = epoch_batches(lengths, cfg.batch_size, cfg.seed, epoch)
        for indices in batches[rank : per_epoch * world_size : world_size]:
            state.elapsed_s, stop = clock.read(ask_before, state.step)
            if stop:
                raise TrainingStopped(f"stopped on request at step {state.step}")
            if cfg.time_budget_s is not None and state.step and \
                    state.elapsed_s >= cfg.time_budget_s:
                state.stopped_early = True
                break
            lr = get_lr(state.step, total, cfg, state.elapsed_s)
            step_loss, correct, counted = _optimise(model, trainee, cache, indices, cfg,
                                                    optimizer, params, lr)
            state.step += 1
            state.examples_seen += len(indices) * world_size
            running.append(step_loss)
            if state.step % cfg.log_every == 0 or state.step == total:
                state.loss_curve.append((state.step, sum(running) / len(running)))
                running = []
            if on_step is not None:
                acc = (correct.float() / counted.clamp_min(1)).tolist()
                on_step(StepMetrics(state.step, epoch, step_loss, lr, acc))
            if ask_before is None and should_stop is not None and should_stop():
                raise TrainingStopped(f"stopped on request at step {state.step}")
        if not state.stopped_early:
            state.epoch = epoch + 1
        state.elapsed_s, _ = clock.read()
        state.optimizer = optimizer.state_dict()
        if on_epoch_end is not None:  # also after a cut-short epoch: the final checkpoint
            on_epoch_end(state)
        if state.stopped_early:
            log.info("time budget of %.0fs used after %d steps", cfg.time_budget_s, state.step)
            break
    model.eval()
    log.info("trained %d steps (%d examples) in %.1fs", state.step, state.examples_seen,
             time.perf_counter() - started)
    return state


def _optimise(model: nn.Module, trainee: nn.Module, cache: FeatureCache, indices: list[int],
              cfg: LoopConfig, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
              lr: float) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One optimiser step at rate ``lr`` on one batch: (loss, correct, counted)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, correct, counted = _batch_loss(model, trainee, cache, indices, cfg.precision,
                                         params[0].device)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    optimizer.step()
    return float(loss.detach()), correct, counted


class _Clock:
    """Training seconds, continuing from ``already`` (a resumed run). With several ranks one
    all-reduce (MAX, on ``device``: NCCL reduces only CUDA tensors) per read gives every rank
    the slowest one's clock, so they agree on the rate and on stopping for the budget, and
    a stop any rank asks for, so they agree on stopping on request."""

    def __init__(self, already: float, world_size: int, device: torch.device,
                 rank: int = 0) -> None:
        self.origin = time.perf_counter() - already
        self.device, self.rank = device, rank
        self.shared = world_size > 1 and torch.distributed.is_available() and \
            torch.distributed.is_initialized()

    def read(self, ask: Callable[[], bool] | None = None, step: int = 0) -> tuple[float, bool]:
        """(seconds so far, whether any rank's ``ask`` said stop); unshared, ``ask`` alone.
        Shared, an ``ask`` that raises still takes this rank through the all-reduce: unless
        some rank said stop, every rank then raises :class:`StopQuestionFailed` (``step``:
        the step it was asked before)."""
        value = time.perf_counter() - self.origin
        if not self.shared:
            return value, ask is not None and bool(ask())
        stop, error = False, None
        if ask is not None:
            try:
                stop = bool(ask())
            except Exception as exc:  # the group must hear of it, below
                error = exc
        t = torch.tensor([value, float(stop), 0.0 if error is None else self.rank + 1.0],
                         dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        value, anyone, failed = t.tolist()  # the step's one host sync
        if error is not None:
            log.warning("rank %d could not ask whether to stop before step %d: %r",
                        self.rank, step, error)
        if failed and not anyone:
            raise StopQuestionFailed(self._failure(int(failed) - 1, error, step)) from error
        return value, anyone > 0

    def _failure(self, failed: int, error: Exception | None, step: int) -> str:
        """Rank ``failed``'s account of its failed question, broadcast to every rank (UTF-8,
        at most :data:`_FAILURE_BYTES`)."""
        text = b"" if self.rank != failed or error is None else (
            f"rank {failed} could not ask whether to stop before step {step}: "
            f"{type(error).__name__}: {error}").encode()[:_FAILURE_BYTES]
        data = torch.zeros(_FAILURE_BYTES, dtype=torch.uint8)
        data[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
        data = data.to(self.device)
        torch.distributed.broadcast(data, src=failed)
        return bytes(data.cpu().tolist()).rstrip(b"\0").decode(errors="replace")


#: the most of a failed stop question's account that reaches the other ranks
_FAILURE_BYTES = 1024


#: the loop's numerics (a request's ``auto`` is resolved to one of them before the loop)
PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str, name: str = "precision") -> None:
    """Refuse (:class:`TrainingInputError`, naming ``name``) a request's precision other
    than auto, fp32 or bf16."""
    if precision not in ("auto", *PRECISIONS):
        raise TrainingInputError(f"{name} must be auto, fp32 or bf16, got {precision!r}")


def _autocast(precision: str, device: torch.device):
    """bfloat16 autocast for ``"bf16"`` (weights and optimiser stay float32), else a no-op."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


@torch.no_grad()
def evaluate(trainee: nn.Module, cache: FeatureCache, batch_size: int = 8) -> dict[str, object]:
    """Held-out loss and top-1 agreement with the target at each unrolled step."""
    was_training = trainee.training
    trainee.eval()
    total_loss, batches = 0.0, 0
    correct = counted = None
    for start in range(0, len(cache), batch_size):
        indices = list(range(start, min(len(cache), start + batch_size)))
        loss, c, n = trainee(**trainee.make_batch(cache, indices))
        total_loss, batches = total_loss + float(loss), batches + 1
        correct = c if correct is None else correct + c
        counted = n if counted is None else counted + n
    trainee.train(was_training)
    assert correct is not None and counted is not None
    accuracy = (correct.float() / counted.clamp_min(1)).tolist()
    return {"loss": total_loss / max(1, batches), "accuracy": accuracy,
            "positions": int(counted[0])}

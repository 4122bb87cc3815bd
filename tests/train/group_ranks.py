"""Process body for the two-rank stop test (importable, so ``spawn`` can run it): one rank of
a gloo group running :func:`~autospec.train.loop.train_loop` on a trainee and a cache that
stand for real ones (the loop's collectives are its own; no DDP needed to test them)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn


class Trainee(nn.Module):
    """A linear layer on constant inputs: a loss with a graph, nothing more."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(4, 1)

    def make_batch(self, cache: Cache, indices: list[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(len(indices), 4)}

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss = self.w(x).pow(2).mean()
        return loss, torch.ones(1), torch.ones(1)


class Cache:
    """``size`` sequences of 5 tokens: what the loop reads of a feature cache."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def lengths(self) -> torch.Tensor:
        return torch.full((self.size,), 5)


def rank(rank: int, store_file: str, out: str, plan: dict[int, tuple[int, str]]) -> None:
    """Train as ``rank`` of 2. ``plan``: per rank, after how many of its steps its own
    ``should_stop`` says True (``"stop"``) or raises an ``OSError`` as reading a marker on a
    network filesystem can (``"raise"``). Writes ``out/rank<r>.json``: how the loop ended, its
    steps."""
    import torch.distributed as dist

    from autospec.train.errors import TrainingStopped
    from autospec.train.loop import LoopConfig, train_loop

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=20))
    steps: list[int] = []
    after, answer = plan.get(rank, (None, "stop"))

    def should_stop() -> bool:
        if after is None or len(steps) < after:
            return False
        if answer == "raise":
            raise OSError(116, "Stale file handle")
        return True

    try:
        train_loop(Trainee(), Cache(64), LoopConfig(epochs=4, batch_size=4, warmup_steps=1),
                   rank=rank, world_size=2, on_step=lambda m: steps.append(m.step),
                   should_stop=should_stop)
        ended = "finished"
    except TrainingStopped as exc:
        ended = f"TrainingStopped: {exc}"
    except Exception as exc:  # reported to the test, which names it
        ended = f"{type(exc).__name__}: {exc}"[:300]
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"ended": ended,
                                                            "steps": len(steps)}))
    dist.destroy_process_group()

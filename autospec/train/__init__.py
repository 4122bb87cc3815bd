"""Training candidates on fresh traffic, each kind as it declares (``eagle3`` and ``draft`` by
gradient, ``suffix`` by index; :func:`autospec.speculators.registry.trainable_kinds`).

Layout (each module's docstring states its contract):

- :mod:`~autospec.train.data` — a traffic window -> prompt+output sequences, held-out split,
  anchors; :mod:`~autospec.train.features` — teacher-forced target passes, cached in half
  precision; :mod:`~autospec.train.kinds` — how a kind trains, read from its declaration
  (the recipes — losses, warm starts, initialisations — live in the kind's own module);
- :mod:`~autospec.train.loop` — the plain PyTorch loop (runs without Ray);
  :mod:`~autospec.train.ray_trainer` — the thin Ray Train wrapper (DDP, checkpoints, resume);
- :mod:`~autospec.train.run` — one run end to end, with registration;
  :mod:`~autospec.train.cli` — ``autospec train``.

Knows nothing of serving. Typical use::

    from autospec.train import TrainRequest, train_candidate, parse_window
    outcome = train_candidate(TrainRequest(kind="eagle3", window=parse_window("24h")),
                              engine=store_engine, target=target)
    outcome.version  # registered as a candidate
"""

from autospec.train.data import TrainingData, TrainSequence, WindowSpec, parse_window
from autospec.train.errors import (
    EmptyWindow,
    IncumbentMismatch,
    TrainingError,
    TrainingInputError,
    TrainingStopped,
    WindowTooSmall,
)
from autospec.train.run import TrainOutcome, TrainRequest, train_candidate

__all__ = [
    "EmptyWindow",
    "IncumbentMismatch",
    "TrainOutcome",
    "TrainRequest",
    "TrainSequence",
    "TrainingData",
    "TrainingError",
    "TrainingInputError",
    "TrainingStopped",
    "WindowSpec",
    "WindowTooSmall",
    "parse_window",
    "train_candidate",
]

"""Training candidates on fresh traffic, each kind as it declares (``eagle3`` and ``draft`` by
gradient, ``suffix`` by index; :func:`autospec.speculators.registry.trainable_kinds`).

Layout (each module's docstring states its contract):

- :mod:`~autospec.train.data` — a traffic window -> prompt+output sequences, held-out split,
  anchors; :mod:`~autospec.train.features` — teacher-forced target passes, cached in half
  precision; :mod:`~autospec.train.kinds` — how a kind trains, read from its declaration
  (the recipes — losses, warm starts, initialisations — live in the kind's own module);
- :mod:`~autospec.train.loop` — the plain PyTorch loop (runs without Ray);
  :mod:`~autospec.train.ray_trainer` — the thin Ray Train wrapper (DDP, checkpoints, resume);
- :mod:`~autospec.train.run` — one run end to end; :mod:`~autospec.train.register` — its
  candidate's artifact moved into place and registered;
  :mod:`~autospec.train.cli` — ``autospec train``.

Knows nothing of serving. The package itself imports nothing (``autospec train --help``
needs no torch): import from the modules. Typical use::

    from autospec.train.data import parse_window
    from autospec.train.run import TrainRequest, train_candidate
    outcome = train_candidate(TrainRequest(kind="eagle3", window=parse_window("24h")),
                              engine=store_engine, target=target)
    outcome.version  # registered as a candidate
"""

"""The holdout: a share of requests a replica serves with speculation off, drawn at random.

The ledger (:mod:`autospec.ledger`) counts what speculation saved as ``tokens ÷ R − decode
seconds``, R being the target's own decode rate. A rate the gate measured minutes or hours
earlier, on a few prompts and perhaps another machine, is off by as much as the load moved
since: 11 % on a quiet 2-core machine became 30 % in the saving (docs/segments-bench.md).
Requests held out of speculation at random in the period itself are a control group: they
decode target-only on the same replicas, at the same load, on the same traffic, and their
rate is R for that period (``ServeConfig.holdout_fraction``; docs/ledger.md). The server
marks their rows ``sampling.holdout`` (:data:`autospec.store.ledger.HOLDOUT_KEY`).

Native engine only: there a replica decodes one request at a time, so a held-out request's
time is the target's alone. In a vLLM batch a request without drafts still waits for the
step that verifies the others' drafts; its rate is not the target-only one, and
:class:`~autospec.serve.config.ServeConfig` refuses a holdout on vLLM.
"""

from __future__ import annotations

import random


class Holdout:
    """Draws which requests are held out: each independently, with ``fraction``."""

    def __init__(self, fraction: float, rng: random.Random | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"holdout fraction {fraction} is not in [0, 1]")
        self.fraction = fraction
        self._rng = rng or random.Random()

    def draw(self) -> bool:
        """True: serve the next request with speculation off."""
        return self.fraction > 0.0 and self._rng.random() < self.fraction

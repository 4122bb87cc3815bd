"""Measured cost of the target half of a speculative step: a forward over n tokens.

Timings on a shared machine are noisy; each figure is the fastest of several repeats,
the least disturbed run. Used by the decode benchmark and by shadow evaluation's
estimated speedup (which takes the speculator half from its replay: ``ReplayStats.draft_s``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from autospec.engine.target import Target


@torch.inference_mode()
def verify_cost(target: Target, sizes: Sequence[int] = (1, 2, 4, 6, 8), context: int = 128,
                repeats: int = 8) -> dict[int, float]:
    """Seconds of one target forward over ``n`` new tokens after ``context`` tokens."""
    prompt = torch.arange(10, 10 + context) % target.info.vocab_size
    cache = target.new_cache()
    target.forward(prompt, cache, logits_to_keep=1)
    result = {}
    for n in sizes:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            target.forward(torch.arange(20, 20 + n) % target.info.vocab_size, cache)
            times.append(time.perf_counter() - started)
            cache.crop(context)
        result[n] = min(times)
    return result

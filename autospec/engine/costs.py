"""Measured cost of the target half of a speculative step: a forward over n tokens.

Timings on a shared machine are noisy; each figure is the fastest of several repeats,
the least disturbed run, and the sizes take turns within each repeat (1, 2, 4, …, then
again), so a burst of load that outlasts a few forwards slows one repeat of every size
rather than every repeat of one size. Each read of the clock waits for the device
(:mod:`clock`), so on a GPU a figure is the forward's run time, not its launch. Used by the
decode benchmark and by shadow evaluation's estimated speedup (which takes the speculator
half from its replay: ``ReplayStats.draft_s``, timed the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autospec.engine.clock import clock
from autospec.engine.target import Target


@torch.inference_mode()
def verify_cost(target: Target, sizes: Sequence[int] = (1, 2, 4, 6, 8), context: int = 128,
                repeats: int = 8) -> dict[int, float]:
    """Seconds of one target forward over ``n`` new tokens after ``context`` tokens."""
    device = target.device
    prompt = torch.arange(10, 10 + context, device=device) % target.info.vocab_size
    cache = target.new_cache()
    target.forward(prompt, cache, logits_to_keep=1)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            ids = torch.arange(20, 20 + n, device=device) % target.info.vocab_size
            started = clock(device)  # kernels run asynchronously on GPUs: wait at both ends
            target.forward(ids, cache)
            times[n].append(clock(device) - started)
            cache.crop(context)
    result = {n: min(t) for n, t in times.items()}
    return result

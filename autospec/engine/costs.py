"""Measured costs of the two halves of a speculative step: verify (target) and propose.

Timings on a shared machine are noisy; each figure is the fastest of several repeats,
the least disturbed run. Used by the decode benchmark and by shadow evaluation's
estimated speedup.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.speculators.base import Speculator


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


@torch.inference_mode()
def propose_cost(target: Target, spec: Speculator, prompt_ids: list[int], k: int,
                 repeats: int = 5) -> float:
    """Seconds of one ``propose(k)`` after ``prompt_ids`` (features computed as in decoding)."""
    layers = spec.feature_layers
    prompt = torch.tensor(prompt_ids, dtype=torch.long)
    out = target.forward(prompt, target.new_cache(), feature_layers=layers, logits_to_keep=1)
    first = out.logits[-1].argmax().reshape(1)
    params = SamplingParams(max_new_tokens=k + 1)
    times = []
    for _ in range(repeats):
        spec.begin(prompt, out.features)
        spec.commit(first, out.features[-1:] if layers else None)
        started = time.perf_counter()
        spec.propose(k, params, None)
        times.append(time.perf_counter() - started)
    return min(times)

"""Sampling parameters and the one function that turns logits into a distribution.

The logit bias, temperature, top-k and top-p shape the target's ``p`` and the speculator's
``q`` in exactly the same way (:func:`probs_from_logits`); rejection sampling against the
shaped ``p`` is what keeps decoding lossless. ``temperature == 0`` means greedy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    #: (token id, bias) added to the logits before anything else, as OpenAI's ``logit_bias``
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: OpenAI's penalties on the tokens generated so far (:func:`penalized`)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalizes(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty)


def penalized(logits: torch.Tensor, params: SamplingParams, generated: Sequence[int],
              chain: Sequence[int] = ()) -> torch.Tensor:
    """``logits`` (``[rows, vocab]``) with OpenAI's penalties, as vLLM applies them: row ``i``
    loses ``frequency_penalty`` × the count of each token generated before it (``generated``
    then ``chain[:i]``) and ``presence_penalty`` once per such token; the prompt is not
    counted. Unchanged without penalties."""
    if not params.penalizes:
        return logits
    out = logits.float().clone()
    counts = Counter(generated)
    for i in range(out.shape[0]):
        if i:
            counts[int(chain[i - 1])] += 1
        if counts:
            ids = torch.tensor(list(counts), device=out.device)
            n = torch.tensor(list(counts.values()), dtype=out.dtype, device=out.device)
            out[i, ids] -= params.frequency_penalty * n + params.presence_penalty
    return out


def biased(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits`` (``[..., vocab]``) with the request's ``logit_bias`` added (unchanged
    without one)."""
    if not params.logit_bias:
        return logits
    ids = torch.tensor([t for t, _ in params.logit_bias], device=logits.device)
    bias = torch.tensor([b for _, b in params.logit_bias], device=logits.device)
    out = logits.float().clone()
    out[..., ids] += bias
    return out


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of ``logits`` after the logit bias, temperature, top-k and top-p, in float32.

    ``logits``: ``[..., vocab]``. Greedy params give a one-hot on the argmax.
    """
    assert logits.dim() >= 1
    logits = biased(logits.float(), params)
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of ``probs`` (``[..., vocab]`` -> ``[...]``)."""
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """Greedy argmax or a sample from the shaped distribution of ``logits`` (``[vocab]``)."""
    if params.greedy:
        return biased(logits, params).argmax(-1)
    return sample(probs_from_logits(logits, params), generator)

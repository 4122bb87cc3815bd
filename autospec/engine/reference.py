"""Reference speculators with known acceptance, for tests, benchmarks and evaluation checks.

- :class:`OracleSpeculator` proposes the target's own (greedy) continuation, known in
  advance: every draft is accepted, so τ = k + 1 (up to the end of the request).
- :class:`RandomSpeculator` proposes tokens drawn from a random distribution: almost
  nothing is accepted, so τ ≈ 1 — a bad speculator that must still be lossless.
"""

from __future__ import annotations

import torch

from autospec.engine.protocol import Proposal, Speculator
from autospec.engine.sampling import SamplingParams


class OracleSpeculator(Speculator):
    """Proposes ``continuation[len(committed):][:k]``."""

    kind = "oracle"

    def __init__(self, continuation: list[int]) -> None:
        self.continuation = list(continuation)
        self.position = 0  # output tokens committed so far

    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        self.position = 0

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        self.position += int(tokens.shape[0])

    def propose(self, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        ahead = self.continuation[self.position : self.position + k]
        return Proposal(tokens=torch.tensor(ahead, dtype=torch.long), probs=None)


class RandomSpeculator(Speculator):
    """Draws each draft token from a fixed random distribution over the vocabulary."""

    kind = "random"

    def __init__(self, vocab_size: int, seed: int = 0, peaked: float = 1.0) -> None:
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(vocab_size, generator=g) * peaked
        self.q = torch.softmax(logits, dim=-1)  # [vocab]

    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        pass

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        pass

    def propose(self, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        # drawn where the request's generator lives (the target's device); ids to the host
        device = generator.device if generator is not None else self.q.device
        probs = self.q.to(device).expand(k, -1).contiguous()  # [k, vocab]
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return Proposal(tokens=tokens.cpu(), probs=probs)

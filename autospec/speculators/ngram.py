"""``ngram``: prompt lookup over the prompt and the output so far (no weights, no training).

For ``n`` from ``max_ngram`` down to ``min_ngram``, find the most recent *earlier*
occurrence of the sequence's last ``n`` tokens and propose the (up to ``k``) tokens that
followed it; the first ``n`` that matches wins. Nothing matches: an empty proposal.

Search is O(1) per step: an incremental dict maps every n-gram (n in range) to the
position right after its latest occurrence that has a continuation, i.e. the n-gram
ending at ``i - 1`` is indexed when token ``i`` is appended. The sequence's own suffix is
therefore never its own match. Proposals are deterministic, so ``probs`` is ``None``.

vLLM serves the kind with its own ``ngram`` method (:func:`export_ngram`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator, longest_match, ngrams_ending
from autospec.speculators.config import NgramConfig
from autospec.speculators.kind import Exported, Kind, VllmSupport


class NgramSpeculator(SavableSpeculator):
    """Prompt-lookup speculator; see the module docstring."""

    kind = "ngram"

    def __init__(self, config: NgramConfig, target: Target | None = None) -> None:
        self.config = config
        self._ns = range(config.min_ngram, config.max_ngram + 1)
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    # -- protocol -------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        assert prompt_ids.dim() == 1, f"prompt_ids must be [n], got {tuple(prompt_ids.shape)}"
        self._seq = []
        self._index = {}
        self._extend(prompt_ids.tolist())

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        assert tokens.dim() == 1, f"tokens must be [m], got {tuple(tokens.shape)}"
        self._extend(tokens.tolist())

    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        start = self.match(self._seq)
        if k <= 0 or start is None:
            return Proposal.empty()
        drafts = self._seq[start : start + k]
        return Proposal(tokens=torch.tensor(drafts, dtype=torch.long), probs=None)

    # -- helpers --------------------------------------------------------------------------
    def match(self, seq: list[int]) -> int | None:
        """Start of the continuation of the latest earlier match of ``seq``'s suffix."""
        return longest_match(self._index, seq, self._ns)

    def _extend(self, tokens: list[int]) -> None:
        """Append ``tokens``, indexing each n-gram that now has a continuation."""
        seq, index = self._seq, self._index
        for token in tokens:  # at position len(seq): it continues the n-grams ending before
            for key in ngrams_ending(seq, self._ns):
                index[key] = len(seq)
            seq.append(token)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """No weights: the checkpoint's safetensors file is empty."""
        return {}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if tensors:
            raise ValueError(f"ngram has no weights, got tensors {sorted(tensors)}")


def export_ngram(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    """vLLM's own ``ngram`` method (prompt lookup) with the version's n-gram bounds; no files."""
    c = spec.config
    return Exported(speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                        "prompt_lookup_max": c.max_ngram,
                                        "prompt_lookup_min": c.min_ngram})


KIND = Kind(name="ngram", config=NgramConfig, speculator=NgramSpeculator,
            vllm=VllmSupport(method="ngram", export=export_ngram))

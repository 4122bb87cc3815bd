"""Helpers shared by the speculator tests."""

from __future__ import annotations

import torch

from autospec.engine.protocol import Proposal, Speculator
from autospec.engine.target import Target


def target_features(target: Target, ids: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """Target features ``[n, len(layers) * H]`` of every position of ``ids`` (one pass)."""
    return target.forward(ids, target.new_cache(), feature_layers=layers).features


def feed_from_scratch(spec: Speculator, seq: torch.Tensor, n_prompt: int,
                      feats: torch.Tensor | None) -> None:
    """``begin`` with ``seq[:n_prompt]``, then one ``commit`` of all of ``seq[n_prompt:]``."""
    spec.begin(seq[:n_prompt], None if feats is None else feats[:n_prompt])
    spec.commit(seq[n_prompt:], None if feats is None else feats[n_prompt - 1 : -1])


def assert_valid(proposal: Proposal, k: int, vocab: int) -> None:
    """Tokens in the vocabulary; ``probs`` None (one-hot) or rows that sum to 1 and cover
    their token."""
    assert 0 < proposal.num_tokens <= k
    assert proposal.tokens.dtype == torch.long
    assert bool(((proposal.tokens >= 0) & (proposal.tokens < vocab)).all())
    if proposal.probs is None:
        return
    assert proposal.probs.shape == (proposal.num_tokens, vocab)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(proposal.num_tokens))
    picked = proposal.probs.gather(1, proposal.tokens[:, None]).squeeze(1)
    assert bool((picked > 0).all())

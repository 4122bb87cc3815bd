"""Lossless verification of draft tokens: small pure tensor functions.

Per verification step the speculator proposed ``k`` **draft tokens**; the target ran
once over the pending token and the drafts, giving ``k + 1`` next-token distributions.

- **accepted** tokens: the longest prefix of drafts the target agrees with (greedy) or
  that survives rejection sampling;
- **recovered** token: on the first rejection, a token sampled from the residual
  ``norm(max(0, p - q))`` (sampling) or the target's argmax (greedy);
- **bonus** token: when every draft is accepted, the target's own next token from the
  ``k + 1``-th distribution.

Each function returns ``(num_accepted, next_token)`` where ``next_token`` is the
recovered or bonus token. Both leave the output distribution exactly the target's.
"""

from __future__ import annotations

import torch

from autospec.engine.sampling import sample


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Accept the longest prefix of ``draft`` equal to the target's argmax.

    draft:          # [k] int64
    target_logits:  # [k + 1, vocab]
    """
    assert draft.dim() == 1 and target_logits.dim() == 2
    k = draft.shape[0]
    assert target_logits.shape[0] == k + 1, "need one distribution per draft plus the bonus"
    choice = target_logits.argmax(-1)  # [k + 1]
    num_accepted = int(torch.cumprod(draft == choice[:k], dim=0).sum()) if k else 0
    return num_accepted, int(choice[num_accepted])


def rejection_verify(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    draft:        # [k] int64, drawn from draft_probs
    draft_probs:  # [k, vocab] q, or None for a deterministic proposer (q one-hot)
    target_probs: # [k + 1, vocab] p, shaped by the same sampling params as q
    """
    assert draft.dim() == 1 and target_probs.dim() == 2
    k = draft.shape[0]
    assert target_probs.shape[0] == k + 1
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft, target_probs.shape[-1]).float()
    assert draft_probs.shape == (k, target_probs.shape[-1])
    positions = torch.arange(k)
    p_x = target_probs[positions, draft]  # [k]
    q_x = draft_probs[positions, draft]  # [k], > 0 since x was drawn from q
    u = torch.rand(k, generator=generator)
    # accept x with probability min(1, p/q): u < p/q, i.e. u*q < p (q <= p: always)
    accepted = u * q_x < p_x  # [k]
    num_accepted = int(torch.cumprod(accepted, dim=0).sum()) if k else 0
    if num_accepted == k:  # every draft accepted: bonus from p
        return k, int(sample(target_probs[k], generator))
    residual = (target_probs[num_accepted] - draft_probs[num_accepted]).clamp_min(0.0)
    mass = residual.sum()
    # mass is 0 only when p == q at this position, where rejection has probability 0
    dist = residual / mass if mass > 0 else target_probs[num_accepted]
    return num_accepted, int(sample(dist, generator))

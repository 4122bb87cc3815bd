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

A **tree** of drafts (greedy only) is verified by :func:`greedy_tree_verify`: the target
ran over the pending token and every draft at once, each attending to its own ancestors
only, and the deepest branch equal to the target's argmax is accepted.
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
    assert draft.device == target_logits.device, "draft and logits must be on one device"
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
    device = target_probs.device
    assert draft.device == device, "draft and target probs must be on one device"
    k = draft.shape[0]
    assert target_probs.shape[0] == k + 1
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft, target_probs.shape[-1]).float()
    assert draft_probs.shape == (k, target_probs.shape[-1])
    assert draft_probs.device == device, "draft and target probs must be on one device"
    positions = torch.arange(k, device=device)
    p_x = target_probs[positions, draft]  # [k]
    q_x = draft_probs[positions, draft]  # [k], > 0 since x was drawn from q
    u = torch.rand(k, generator=generator, device=device)
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


def tree_depths(parents: list[int]) -> list[int]:
    """Position of each draft after the pending token (1 for its children), from the
    index of each draft's parent (-1: the pending token; parents come first)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def accept_tree(draft: torch.Tensor, parents: torch.Tensor, choice: torch.Tensor) -> list[int]:
    """Indices of the drafts on the deepest branch of a tree that ``choice`` agrees with.

    draft, parents: # [k'] int64 (``parents[i]`` -1: child of the pending token)
    choice:         # [k' + 1] the target's token after row r (row 0: the pending token,
                    # row i + 1: draft i)
    A draft is accepted when its parent was and it equals the target's choice after its
    parent. Ties between equally deep branches go to the earlier draft.
    """
    tokens, par, ch = draft.tolist(), parents.tolist(), choice.tolist()
    depth = [0] * len(tokens)
    best = -1
    for i, (tok, p) in enumerate(zip(tokens, par, strict=True)):
        if (p < 0 or depth[p]) and tok == ch[p + 1]:
            depth[i] = 1 if p < 0 else depth[p] + 1
            if best < 0 or depth[i] > depth[best]:
                best = i
    path = []
    while best >= 0:
        path.append(best)
        best = par[best]
    return path[::-1]


def greedy_tree_verify(draft: torch.Tensor, parents: torch.Tensor,
                       target_logits: torch.Tensor) -> tuple[list[int], int]:
    """The accepted branch of a tree of drafts (indices, root first) and the bonus token.

    target_logits: # [k' + 1, vocab], row 0 after the pending token, row i + 1 after draft i
    """
    assert target_logits.shape[0] == draft.shape[0] + 1
    choice = target_logits.argmax(-1)
    path = accept_tree(draft, parents, choice)
    return path, int(choice[path[-1] + 1 if path else 0])

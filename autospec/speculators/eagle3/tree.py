"""Draft trees of an EAGLE-3 head (as EAGLE-2): the candidates expanded so far, which to
expand next, and the :class:`~autospec.engine.protocol.Proposal` of the likeliest ones."""

from __future__ import annotations

import math

import torch

from autospec.engine.protocol import Proposal


class DraftTree:
    """Candidates of a draft tree: token, parent, cumulative log-prob, and the head cache
    slot of the candidates that were expanded."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.depths: list[int] = []
        self.slots: dict[int, int] = {}  # candidate -> its entry in the head's cache

    def add_children(self, parents: list[int], parent_scores: torch.Tensor,
                     logp: torch.Tensor, d2t: torch.Tensor, width: int) -> list[int]:
        """The ``width`` likeliest children of each parent (``logp [B, Vd]``); their ids."""
        top = (parent_scores[:, None] + logp).topk(width, dim=-1)
        scores, tokens = top.values.tolist(), d2t[top.indices].tolist()  # one copy each
        ids = []
        for row, parent in enumerate(parents):
            for score, token in zip(scores[row], tokens[row], strict=True):
                ids.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(parent)
                self.scores.append(score)
                self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return ids

    def scores_of(self, ids: list[int], device: torch.device) -> torch.Tensor:
        return torch.tensor([self.scores[i] for i in ids], device=device)

    def tokens_of(self, ids: list[int], device: torch.device) -> torch.Tensor:
        return torch.tensor([self.tokens[i] for i in ids], dtype=torch.long, device=device)

    def likeliest(self, ids: list[int], n: int) -> list[int]:
        return sorted(ids, key=lambda i: -self.scores[i])[:n]

    def visibility(self, ids: list[int], real: int, length: int) -> torch.Tensor:
        """Bool ``[B, length - real + B]``: which speculative head-cache entries (after the
        ``real`` ones, up to ``length``, then the B new ones) each of ``ids`` sees: its
        expanded ancestors' and its own."""
        spec_len = length - real
        sees = torch.zeros(len(ids), spec_len + len(ids), dtype=torch.bool)
        for row, i in enumerate(ids):
            sees[row, spec_len + row] = True
            p = self.parents[i]
            while p >= 0:
                sees[row, self.slots[p] - real] = True
                p = self.parents[p]
        return sees

    def placed(self, ids: list[int], first_slot: int) -> None:
        for row, i in enumerate(ids):
            self.slots[i] = first_slot + row

    def worth_expanding(self, frontier: list[int], n: int, min_prob: float) -> bool:
        """Whether a child of ``frontier`` could be among :meth:`proposal`'s ``n``: a child
        is never likelier than its parent, and ties go to the older candidate, so none can
        once every frontier score is below ``min_prob`` or at most the ``n``-th best
        score already drafted."""
        best = max(self.scores[i] for i in frontier)
        if min_prob > 0 and best < math.log(min_prob):
            return False
        if len(self.scores) < n:
            return True
        return best > sorted(self.scores, reverse=True)[n - 1]

    def proposal(self, n: int, min_prob: float = 0.0) -> Proposal:
        """The ``n`` likeliest candidates of at least ``min_prob`` (the likeliest always; a
        child is never likelier than its parent, so they form a tree), ordered by depth
        then likelihood."""
        chosen = sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], i))[:n]
        floor = math.log(min_prob) if min_prob > 0 else -math.inf
        chosen = chosen[:1] + [i for i in chosen[1:] if self.scores[i] >= floor]
        chosen.sort(key=lambda i: (self.depths[i], -self.scores[i]))
        where = {c: j for j, c in enumerate(chosen)}
        parents = [where[self.parents[c]] if self.parents[c] >= 0 else -1 for c in chosen]
        return Proposal(tokens=torch.tensor([self.tokens[c] for c in chosen], dtype=torch.long),
                        probs=None, parents=torch.tensor(parents, dtype=torch.long))


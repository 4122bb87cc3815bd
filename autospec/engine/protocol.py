"""The speculator protocol: what the engine's decode loop calls, owned by the engine.

Every speculator kind (:mod:`autospec.speculators`) implements it; the engine never imports
the speculators package (the layer below owns the interface the layer above fills in).

A speculator proposes up to ``k`` draft tokens for the target to verify, and keeps
whatever per-request state it needs (a KV cache, a token history) so that it can be
rolled back to what the target accepted. It knows nothing of HTTP, databases or
tokenization: it sees token ids and, if it asks for them, the target's hidden states.

Protocol of one request (the engine's decode loop drives it):

1. ``begin(prompt_ids, features)``: a new request. ``prompt_ids`` are the prompt's
   token ids (``[n]``), ``features`` the target's hidden states of the layers in
   ``feature_layers`` for every prompt position (``[n, len(feature_layers) * hidden]``)
   or ``None`` when ``feature_layers`` is empty. The target has already produced the
   first output token; it arrives with the first ``commit``.
2. ``commit(tokens, features)``: the target settled ``tokens`` (``[m]``: the accepted
   drafts followed by the bonus token, or the first output token). ``features`` are the
   target's hidden states at the positions that *produced* those tokens
   (``[m, len(feature_layers) * hidden]``), i.e. the position before each token.
   The speculator rolls back anything speculative it did in ``propose``.
3. ``propose(k, sampling, generator)``: up to ``k`` draft tokens that continue the
   committed sequence, and the draft distribution ``q`` over the *target* vocabulary
   they were drawn from (``[k', vocab]``), or ``None`` for a deterministic proposer
   (then ``q`` is one-hot on each token). A greedy request may be answered with a
   **tree** of drafts instead of a chain (``Proposal.parents``): several candidates per
   position, verified together in one target forward (tree attention); the longest branch
   the target agrees with is accepted. A sampled request always gets a chain.

Steps 2 and 3 alternate until the request ends.

Devices: token ids cross this interface on the host (``prompt_ids``, ``tokens`` and
``Proposal.tokens`` / ``parents`` are CPU tensors: both sides read them as ids);
``features`` are on the target's device; ``Proposal.probs`` may be on the speculator's
device, and ``generator`` is on the target's. The engine moves the drafts and ``probs`` to
the target's device once per step; a speculator moves what it keeps to its own device.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch

from autospec.engine.sampling import SamplingParams
from autospec.engine.verify import tree_depths


@dataclass(frozen=True)
class Proposal:
    """Draft tokens and the distribution they were drawn from, as a chain or a tree.

    A chain (``parents`` None): ``tokens[i]`` follows ``tokens[i - 1]``. A tree:
    ``parents[i]`` is the index of the draft that ``tokens[i]`` follows, or ``-1`` when it
    follows the pending (last settled) token; parents come before their children, no
    branch is deeper than the ``k`` asked for, and ``probs`` is None (greedy only).
    """

    tokens: torch.Tensor  # [k'] int64 on the host (k' may be 0; k' <= k for a chain)
    probs: torch.Tensor | None  # [k', vocab] float32 over the target vocabulary, or None (one-hot)
    parents: torch.Tensor | None = None  # [k'] int64 for a tree, None for a chain

    def __post_init__(self) -> None:
        assert self.tokens.dim() == 1, f"tokens must be [k], got {tuple(self.tokens.shape)}"
        if self.probs is not None:
            assert self.probs.dim() == 2 and self.probs.shape[0] == self.tokens.shape[0]
        if self.parents is not None:
            assert self.probs is None, "a tree of drafts is greedy only (probs None)"
            assert self.parents.shape == self.tokens.shape, "parents must be [k'] like tokens"
            assert bool((self.parents < torch.arange(self.tokens.shape[0])).all()), \
                "each draft's parent must come before it"

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def depths(self) -> list[int]:
        """Position of each draft after the pending token (1 for its children)."""
        if self.parents is None:
            return list(range(1, self.num_tokens + 1))
        return tree_depths(self.parents.tolist())

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> int:
        """Position of the deepest draft (a chain's length)."""
        return max(self.depths(), default=0)

    def first_branch(self) -> Proposal:
        """The chain from the first draft through each node's first child (a tree's
        most likely branch, where drafts are ordered by likelihood); a chain is itself."""
        if self.parents is None:
            return self
        chain, last = [], -1
        for i, p in enumerate(self.parents.tolist()):
            if p == last:
                chain.append(i)
                last = i
        return Proposal(tokens=self.tokens[chain], probs=None)

    def as_verified(self, params: SamplingParams, compactable: bool) -> Proposal:
        """What the target verifies of this proposal: a tree only for a greedy request
        without penalties on a cache that can keep one branch (full attention layers: the
        engine's ``KVCache.compactable``); else its first branch. The decode loop and replay
        both cut here, so replay scores what serving verifies."""
        if self.is_tree and not (params.greedy and compactable and not params.penalizes):
            return self.first_branch()
        return self

    def with_branch(self, branch: list[int]) -> Proposal:
        """This (greedy) proposal as a tree, with the chain ``branch`` after the pending
        token added where the tree does not already hold it."""
        tokens, parents = self.tokens.tolist(), self._parent_list()
        children = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens, strict=True))}
        at = -1
        for tok in branch:
            if (at, tok) not in children:
                children[(at, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(at)
            at = children[(at, tok)]
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), probs=None,
                        parents=torch.tensor(parents, dtype=torch.long))

    def _parent_list(self) -> list[int]:
        if self.parents is None:
            return list(range(-1, self.num_tokens - 1))
        return self.parents.tolist()

    @classmethod
    def empty(cls) -> Proposal:
        return cls(tokens=torch.empty(0, dtype=torch.long), probs=None)


class Speculator(abc.ABC):
    """Proposes draft tokens for one request at a time; see the module docstring."""

    kind: ClassVar[str]
    #: target layers whose hidden states this speculator consumes (empty: none)
    feature_layers: tuple[int, ...] = ()

    @abc.abstractmethod
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        """Start a new request (drops all state of the previous one)."""

    @abc.abstractmethod
    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        """Append tokens the target settled; roll back speculative state."""

    @abc.abstractmethod
    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Propose up to ``k`` tokens continuing the committed sequence."""

    def to(self, device: torch.device | str) -> Speculator:
        """Move weights to ``device`` (no-op for weightless speculators)."""
        return self

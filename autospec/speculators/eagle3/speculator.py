"""``eagle3`` at run time: an :class:`~autospec.speculators.eagle3.model.Eagle3Head` on the
target's hidden states, with a traffic suffix index beside it.

Decoding pairs the feature of target position ``t`` with token ``t+1`` (the pair sits at
RoPE position ``t``) and predicts token ``t+2``. ``begin`` queues the prompt's real
pairs ``(features[i], prompt_ids[i+1])``; each ``commit(tokens, features)`` crops the
head's KV cache back to the real pairs and queues ``(features[j], tokens[j])``;
``propose`` runs every queued pair in one forward (they enter the cache for good; when the
suffix index proposes instead, below, they stay queued until the head is next needed),
then chains draft steps that feed the head's own output hidden and are cropped at the
next commit (or, for greedy requests, drafts a tree: :mod:`~autospec.speculators.eagle3.tree`).
Draft probabilities over ``Vd`` are scattered into the target vocabulary.
Proposal tokens are on the CPU, ``probs`` on the head's device (``None`` when greedy).

**Suffix index beside the head** (as in SuffixDecoding's hybrid with a model-based
speculator): training also builds a :class:`~autospec.speculators.suffix.SuffixSpeculator`
over the window's outputs and stores its arrays as ``suffix.*`` in the same checkpoint
(``config.suffix_tokens`` records its size). At each step the index's best continuation
is proposed instead of the head's chain when its expected accepted length (estimated from
traffic counts) is at least ``config.suffix_threshold`` × k: boilerplate the traffic repeats
word for word costs no head steps (the real pairs committed meanwhile stay queued and run
in one forward at the next head proposal), and the head drafts the rest.
``suffix_threshold = null`` uses the head alone; training then builds no index.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams, probs_from_logits
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator, draw
from autospec.speculators.config import Eagle3Config, SuffixConfig
from autospec.speculators.eagle3.model import Eagle3Head, HeadKVCache
from autospec.speculators.eagle3.tree import DraftTree
from autospec.speculators.eagle3.vocab import build_draft_vocab
from autospec.speculators.suffix import SuffixSpeculator, expected_accepted

log = logging.getLogger(__name__)

SUFFIX_PREFIX = "suffix."  # names of the suffix index's arrays in the checkpoint


# -- the speculator -----------------------------------------------------------------------
class Eagle3Speculator(SavableSpeculator):
    """Drafts with an :class:`Eagle3Head` over the target's features; see the module doc."""

    kind = "eagle3"

    def __init__(self, config: Eagle3Config, target: Target, *, seed: int = 0) -> None:
        _check_target(config, target)
        self.config = config
        self.feature_layers = tuple(config.feature_layers)
        self.vocab_size = target.info.vocab_size
        embed = target.model.get_input_embeddings().weight
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = Eagle3Head(config, embed.detach())  # shares the target's table
        head.set_draft_vocab(build_draft_vocab(
            None, config.draft_vocab_size, vocab_size=self.vocab_size,
            always=target.info.eos_token_ids))
        # in the target's dtype: at batch 1 the head is bound by reading its weights (~6M
        # parameters, more than the CPU's caches hold), so bfloat16 halves its step
        self.head = head.to(device=target.device, dtype=target.dtype).eval()
        self.head.embed_weight = embed.detach()  # still the target's table
        self.device = target.device
        self.suffix = _empty_suffix_index(config)
        self._reset()

    def _reset(self) -> None:
        c = self.config
        self._cache = HeadKVCache(c.num_kv_heads, c.head_dim, device=self.device,
                                  dtype=self.head.fc.weight.dtype)
        self._real = 0  # real pairs in the cache (they stay; anything after is speculative)
        self._queue_features: list[torch.Tensor] = []  # [m, 3H] each
        self._queue_tokens: list[torch.Tensor] = []  # [m] each
        self._last_hidden: torch.Tensor | None = None  # [H] output of the last real pair

    # -- protocol -------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        assert prompt_ids.dim() == 1, f"prompt_ids must be [n], got {tuple(prompt_ids.shape)}"
        self._check_features(features, prompt_ids.shape[0])
        self._reset()
        if self.suffix is not None:
            self.suffix.begin(prompt_ids, None)
        if prompt_ids.shape[0] > 1:
            self._queue(features[:-1], prompt_ids[1:])

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        assert tokens.dim() == 1, f"tokens must be [m], got {tuple(tokens.shape)}"
        self._check_features(features, tokens.shape[0])
        self._cache.crop(self._real)
        self._queue(features, tokens)
        if self.suffix is not None:
            self.suffix.commit(tokens, None)

    @torch.inference_mode()
    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        self._cache.crop(self._real)
        queued = sum(t.shape[0] for t in self._queue_tokens)
        k = min(k, self.config.max_position_embeddings - self._real - queued)
        if k <= 0:
            return Proposal.empty()
        path = self._suffix_path(k)
        if path and self._confident(path, k):  # a continuation seen in traffic: no head
            # steps needed; the queued pairs wait for the next head proposal (one forward)
            return Proposal(tokens=torch.tensor([t for t, _ in path], dtype=torch.long),
                            probs=None)
        if self._queue_tokens:
            self._run_queue()
        if self._last_hidden is None:
            return Proposal.empty()
        if sampling.greedy and self.config.tree_nodes:
            return self._tree(k).with_branch(self._likely_prefix(path))
        hidden = self._last_hidden.unsqueeze(0)  # [1, H]
        d2t = self.head.d2t
        drafted: list[torch.Tensor] = []  # [1] target ids
        rows: list[torch.Tensor] = []  # [Vd] draft probs (sampling only)
        for step in range(k):
            logits = self.head.logits(hidden[-1])  # [Vd]
            if sampling.greedy:
                token = d2t[logits.argmax(-1, keepdim=True)]
            else:
                probs = probs_from_logits(logits, sampling)
                rows.append(probs)
                token = d2t[draw(probs, generator).view(1)]
            drafted.append(token)
            if step + 1 < k:
                hidden = self.head.step_with_own_hidden(hidden[-1:], token, self._cache)
        tokens = torch.cat(drafted)  # [k]
        return Proposal(tokens=tokens.cpu(), probs=self._scatter(tokens, rows))

    def attach_suffix(self, index: SuffixSpeculator | None) -> None:
        """Propose from ``index`` (built from traffic) where it is confident, or drop the
        index (None); see the module doc."""
        self.suffix = index
        size = 0 if index is None else index.corpus_tokens
        self.config = self.config.model_copy(update={"suffix_tokens": size})

    def carried_corpus(self) -> np.ndarray | None:
        """The part of the index a warm-started head carries on (``suffix_carried_tokens``:
        the target's own answers the index was first built from), or None."""
        n = self.config.suffix_carried_tokens
        if self.suffix is None or n <= 0:
            return None
        return self.suffix.corpus_prefix(min(n, self.suffix.corpus_tokens))

    # -- helpers --------------------------------------------------------------------------
    def _tree(self, k: int) -> Proposal:
        """A tree of ``config.tree_nodes`` drafts, depth <= k (EAGLE-2's dynamic tree): each
        depth expands the ``tree_width`` likeliest new candidates (cumulative log-prob of the
        head's drafts) in one head forward, keeping ``tree_width`` children of each; the
        likeliest ``tree_nodes`` of all candidates are proposed, ordered by depth then
        likelihood. Speculative head entries are cropped at the next commit.

        Drafting stops early, with the same proposal, once no descendant of the frontier
        could be proposed (:meth:`DraftTree.worth_expanding`): a head forward costs a
        fraction of a target step on a CPU, so the depths nobody would verify are skipped."""
        width, head = self.config.tree_width, self.head
        nodes, min_prob = self.config.tree_nodes, self.config.tree_min_prob
        tree = DraftTree()
        logp = F.log_softmax(head.logits(self._last_hidden).float(), -1)  # [Vd]
        frontier = tree.add_children([-1], logp.new_zeros(1), logp[None], head.d2t, width)
        hidden = self._last_hidden.expand(len(frontier), -1)
        for depth in range(1, k):
            if not tree.worth_expanding(frontier, nodes, min_prob):
                break
            sees = tree.visibility(frontier, self._real, self._cache.length)
            tree.placed(frontier, self._cache.length)
            out = head.step_tree(hidden, tree.tokens_of(frontier, self.device), self._cache,
                                 self._real, self._real + depth - 1, sees)
            logp = F.log_softmax(head.logits(out).float(), -1)  # [B, Vd]
            children = tree.add_children(frontier, tree.scores_of(frontier, logp.device),
                                         logp, head.d2t, width)
            best = tree.likeliest(children, width)
            hidden = out[[children.index(c) // width for c in best]]
            frontier = best
        return tree.proposal(nodes, min_prob)

    def _suffix_path(self, k: int) -> list[tuple[int, float]]:
        """The suffix index's likeliest continuation (none without an index or threshold)."""
        if self.suffix is None or self.config.suffix_threshold is None:
            return []
        return self.suffix.best_path(k)

    def _likely_prefix(self, path: list[tuple[int, float]]) -> list[int]:
        """The tokens of ``path`` whose cumulative probability is at least tree_min_prob."""
        tokens, cum = [], 1.0
        for token, prob in path:
            cum *= prob
            if cum < self.config.tree_min_prob:
                break
            tokens.append(token)
        return tokens

    def _confident(self, path: list[tuple[int, float]], k: int) -> bool:
        """Whether the index's path's expected accepted length reaches the threshold."""
        return expected_accepted(path) >= self.config.suffix_threshold * k

    def _queue(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        self._queue_features.append(features.detach().to(self.device))
        self._queue_tokens.append(tokens.detach().to(self.device, torch.long))

    def _run_queue(self) -> None:
        """Run every queued real pair in one forward; they enter the cache for good."""
        features = torch.cat(self._queue_features)  # [m, 3H]
        tokens = torch.cat(self._queue_tokens)  # [m]
        self._queue_features, self._queue_tokens = [], []
        room = self.config.max_position_embeddings - self._real
        if tokens.shape[0] > room:
            raise ValueError(f"eagle3 head holds {self.config.max_position_embeddings} "
                             f"positions; {self._real + tokens.shape[0]} needed")
        out = self.head.step_with_features(features.to(self.head.fc.weight.dtype), tokens,
                                           self._cache)
        self._real = self._cache.length
        self._last_hidden = out[-1]

    def _scatter(self, tokens: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor | None:
        """Draft probs over the target vocabulary, ``[k, V]``; None (one-hot) when greedy."""
        if not rows:
            return None
        full = torch.zeros(tokens.shape[0], self.vocab_size, device=tokens.device)
        full[:, self.head.d2t] = torch.stack(rows)
        return full

    def _check_features(self, features: torch.Tensor | None, n: int) -> None:
        width = 3 * self.config.hidden_size
        if features is None or features.dim() != 2 or tuple(features.shape) != (n, width):
            shape = None if features is None else tuple(features.shape)
            raise ValueError(f"eagle3 needs target features [{n}, {width}], got {shape}")

    # -- weights --------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The head's weights and ``d2t`` (the target's embedding is not stored), and the
        suffix index's arrays as ``suffix.*`` when it has one."""
        tensors = dict(self.head.state_dict())
        if self.suffix is not None:
            index = self.suffix.state_tensors()
            tensors.update({f"{SUFFIX_PREFIX}{n}": t for n, t in index.items()})
        return tensors

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        tensors = dict(tensors)
        index = {n.removeprefix(SUFFIX_PREFIX): tensors.pop(n) for n in list(tensors)
                 if n.startswith(SUFFIX_PREFIX)}
        if self.suffix is not None:
            self.suffix.load_tensors(index)
        d2t = tensors.pop("d2t")
        self.head.load_state_dict({**tensors, "d2t": self.head.d2t}, strict=True)
        self.head.set_draft_vocab(d2t.long())

    def hold_float32(self) -> None:
        table = self.head.embed_weight
        self.head.float()
        self.head.embed_weight = table  # still the target's table (``embed`` casts its rows)
        self._reset()  # the KV cache in the head's dtype

    def to(self, device: torch.device | str) -> Eagle3Speculator:
        self.head.to(device)
        self.device = torch.device(device)
        self._reset()
        return self


def index_config(config: Eagle3Config) -> SuffixConfig:
    """The settings of the suffix index beside a head (training builds it with these)."""
    return SuffixConfig(target_id=config.target_id, target_revision=config.target_revision,
                        corpus_tokens=config.suffix_tokens)


def _empty_suffix_index(config: Eagle3Config) -> SuffixSpeculator | None:
    """A suffix index of the configured size (filled by loading), or None if it has none."""
    return SuffixSpeculator(index_config(config)) if config.suffix_tokens else None


def _check_target(config: Eagle3Config, target: Target) -> None:
    info = target.info
    if config.hidden_size != info.hidden_size:
        raise ValueError(f"eagle3 hidden_size {config.hidden_size} != target's {info.hidden_size}")
    if config.target_vocab_size != info.vocab_size:
        raise ValueError(
            f"eagle3 target_vocab_size {config.target_vocab_size} != target's {info.vocab_size}"
        )
    bad = [i for i in config.feature_layers if i > info.num_layers]
    if bad:
        raise ValueError(
            f"feature_layers {bad} beyond the target's {info.num_layers} layers"
        )
    embed = target.model.get_input_embeddings().weight
    if embed.shape[0] != info.vocab_size:
        raise ValueError(
            f"target embedding has {embed.shape[0]} rows, LM head {info.vocab_size}"
        )

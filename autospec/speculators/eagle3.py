"""``eagle3``: an EAGLE-3 style head on the target's hidden states.

Model (:class:`Eagle3Head`), for target hidden size ``H`` and draft vocabulary ``Vd``:

- ``fc``: the concatenated hidden states of three target layers (``[*, 3H]``) -> ``[*, H]``;
- one decoder layer whose attention input is, as in EAGLE-3, the *concatenation*
  ``[input_norm(embed(token)), hidden_norm(hidden)]`` (``[*, 2H]``; q/k/v project from
  2H), with the residual stream starting from ``hidden``; then the usual MLP block;
- the layer's output (pre-norm, ``[*, H]``) is the head's own "feature": draft steps
  after the first feed it in place of ``fc(features)``;
- final RMSNorm and an LM head over a reduced draft vocabulary of ``Vd`` tokens, with
  buffers ``d2t`` (draft id -> target id, ``int64 [Vd]``, stored in the checkpoint) and
  ``t2d`` (``bool [V]``, which target ids the draft can emit; derived from ``d2t``).

The token embedding is the target's own table, taken from the target at build/load time
(a frozen, non-persistent buffer sharing the target's memory; never stored in a
checkpoint, which keeps the artifact small and the head tied to its target).

Decoding pairs the feature of target position ``t`` with token ``t+1`` (the pair sits at
RoPE position ``t``) and predicts token ``t+2``. ``begin`` queues the prompt's real
pairs ``(features[i], prompt_ids[i+1])``; each ``commit(tokens, features)`` crops the
head's KV cache back to the real pairs and queues ``(features[j], tokens[j])``;
``propose`` runs every queued pair in one forward (they enter the cache for good; when the
suffix index proposes instead, below, they stay queued until the head is next needed),
then chains draft steps that feed the head's own output hidden and are cropped at the
next commit. Draft probabilities over ``Vd`` are scattered into the target vocabulary.
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

Training (:mod:`autospec.train.models`) uses :meth:`Eagle3Head.ttt_forward`:
teacher-forced over whole sequences, unrolling ``steps`` draft steps exactly as decoding
attends (checked against the decode path in the tests).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams, probs_from_logits
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator, draw
from autospec.speculators.config import Eagle3Config, SuffixConfig
from autospec.speculators.suffix import SuffixSpeculator, expected_accepted

log = logging.getLogger(__name__)

SUFFIX_PREFIX = "suffix."  # names of the suffix index's arrays in the checkpoint


# -- building blocks ----------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class HeadKVCache:
    """Keys and values of the head's one layer, preallocated, with an explicit length."""

    def __init__(self, num_kv_heads: int, head_dim: int, *, device: torch.device,
                 dtype: torch.dtype, capacity: int = 256) -> None:
        self.k = torch.empty(1, num_kv_heads, capacity, head_dim, device=device, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``k``/``v`` (``[1, kv_heads, T, head_dim]``); return all keys and values."""
        assert k.dim() == 4 and k.shape[0] == 1, f"k must be [1, h, T, d], got {tuple(k.shape)}"
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            self._grow(end)
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def crop(self, length: int) -> None:
        assert 0 <= length <= self.length, f"cannot crop {self.length} to {length}"
        self.length = length

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.k.shape[2])
        k = self.k.new_empty(*self.k.shape[:2], capacity, self.k.shape[3])
        v = torch.empty_like(k)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over ``[embed, hidden]`` (2H), then an MLP."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.q_proj = nn.Linear(2 * h, config.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, config.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, config.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_heads * hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)
        self.norm_before_residual = config.norm_before_residual
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
        self._inv_freq32 = inv_freq  # the float32 values, whatever the module is cast to
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """Casts (``.to(torch.bfloat16)``, ``.half()``) leave the RoPE frequencies in
        float32; moves move them: in bfloat16 the angles at position 2000 would be off by
        ~0.4 rad from training's in float32."""
        super()._apply(fn, recurse)
        self.inv_freq = self._inv_freq32.to(self.inv_freq.device)
        return self

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """RoPE angles ``[T, head_dim / 2]`` of ``positions`` (``[T]``), in float32."""
        return positions.float()[:, None] * self.inv_freq[None, :]

    def qkv(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        """Queries, keys, values (``[B, heads, T, head_dim]``) of pairs at ``positions`` ([T])."""
        assert hidden.dim() == 3 and embeds.shape == hidden.shape, "hidden/embeds: [B, T, H]"
        b, t, _ = hidden.shape
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        freqs = self.angles(positions)  # [T, head_dim / 2], float32 whatever the head's dtype
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def finish(self, hidden: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Attention over ``k``/``v`` (``mask``: bool, True = attend), then MLP; ``[B, T, H]``.

        The residual stream starts from ``hidden`` (or from ``hidden_norm(hidden)`` with
        ``norm_before_residual``, as some published heads were trained)."""
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        b, _, t, _ = attn.shape
        residual = self.hidden_norm(hidden) if self.norm_before_residual else hidden
        h = residual + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# -- the head -----------------------------------------------------------------------------
class Eagle3Head(nn.Module):
    """fc + one decoder layer + norm + reduced-vocab LM head; see the module docstring."""

    def __init__(self, config: Eagle3Config, embed_weight: torch.Tensor) -> None:
        super().__init__()
        assert embed_weight.dim() == 2, "embed_weight must be [vocab, hidden]"
        assert tuple(embed_weight.shape) == (config.target_vocab_size, config.hidden_size), (
            f"embedding {tuple(embed_weight.shape)} != "
            f"({config.target_vocab_size}, {config.hidden_size})"
        )
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.layer = Eagle3Layer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        d2t = torch.arange(config.draft_vocab_size, dtype=torch.long)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", torch.zeros(config.target_vocab_size, dtype=torch.bool),
                             persistent=False)
        self.set_draft_vocab(d2t)

    def set_draft_vocab(self, d2t: torch.Tensor) -> None:
        """Set the draft -> target id map (``int64 [Vd]``, distinct ids) and derive ``t2d``."""
        assert d2t.dim() == 1 and d2t.shape[0] == self.config.draft_vocab_size, "d2t: [Vd]"
        v = self.config.target_vocab_size
        if d2t.min() < 0 or d2t.max() >= v or d2t.unique().numel() != d2t.numel():
            raise ValueError(f"d2t must hold {d2t.numel()} distinct target ids in [0, {v})")
        self.d2t.copy_(d2t.to(self.d2t.device))
        self.t2d.zero_()
        self.t2d[self.d2t] = True

    def embed(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the (target's) embedding table, in the head's dtype."""
        return F.embedding(target_ids, self.embed_weight).to(self.fc.weight.dtype)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[*, 3H]`` -> the head's hidden width ``[*, H]``."""
        return self.fc(features)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[*, Vd]`` of output hiddens ``[*, H]``."""
        return self.lm_head(self.norm(hidden))

    # decoding: one sequence, the head's KV cache -------------------------------------
    def step_with_features(self, features: torch.Tensor, tokens: torch.Tensor,
                           cache: HeadKVCache) -> torch.Tensor:
        """Run real pairs (``features [T, 3H]``, ``tokens [T]``) after ``cache``; ``[T, H]``."""
        assert features.dim() == 2, f"features must be [T, 3H], got {tuple(features.shape)}"
        return self.step(self.project(features), tokens, cache)

    def step_with_own_hidden(self, hidden: torch.Tensor, tokens: torch.Tensor,
                             cache: HeadKVCache) -> torch.Tensor:
        """Run draft pairs (own output ``hidden [T, H]``, ``tokens [T]``); ``[T, H]``."""
        return self.step(hidden, tokens, cache)

    def step(self, hidden: torch.Tensor, tokens: torch.Tensor,
             cache: HeadKVCache) -> torch.Tensor:
        """Pairs (``hidden [T, H]``, ``tokens [T]``) at positions ``cache.length + arange(T)``."""
        assert hidden.dim() == 2 and tokens.dim() == 1 and hidden.shape[0] == tokens.shape[0]
        t, start = tokens.shape[0], cache.length
        positions = torch.arange(start, start + t, device=hidden.device)
        hidden = hidden.unsqueeze(0)
        q, k, v = self.layer.qkv(hidden, self.embed(tokens).unsqueeze(0), positions)
        k, v = cache.append(k, v)
        mask = None
        if t > 1:  # query i sees keys <= start + i
            keys = torch.arange(start + t, device=hidden.device)
            mask = keys[None, :] <= positions[:, None]  # [T, start + T]
        return self.layer.finish(hidden, q, k, v, mask)[0]

    def step_tree(self, hidden: torch.Tensor, tokens: torch.Tensor, cache: HeadKVCache,
                  real: int, position: int, sees: torch.Tensor) -> torch.Tensor:
        """Draft pairs of one tree depth (``hidden [B, H]``, ``tokens [B]``), all at
        ``position``; each attends to the first ``real`` cache entries and to the
        speculative ones after them that its row of ``sees`` (bool ``[B, L - real + B]``,
        ``L`` the cache length before) marks: its ancestors and itself. ``[B, H]``."""
        b = tokens.shape[0]
        positions = torch.full((b,), position, device=hidden.device)
        hidden = hidden.unsqueeze(0)
        q, k, v = self.layer.qkv(hidden, self.embed(tokens).unsqueeze(0), positions)
        k, v = cache.append(k, v)
        mask = torch.cat([torch.ones(b, real, dtype=torch.bool, device=hidden.device),
                          sees.to(hidden.device)], 1)
        return self.layer.finish(hidden, q, k, v, mask)[0]

    # training: whole sequences, teacher-forced -------------------------------------
    def ttt_forward(self, features: torch.Tensor, next_ids: torch.Tensor,
                    steps: int = 1) -> list[torch.Tensor]:
        """Logits ``[B, T, Vd]`` for each of ``steps`` unrolled draft steps.

        The logits of :meth:`ttt_hidden`'s outputs (training computes them only at the
        positions it counts).
        """
        return [self.logits(out) for out in self.ttt_hidden(features, next_ids, steps)]

    def ttt_hidden(self, features: torch.Tensor, next_ids: torch.Tensor,
                   steps: int = 1, start: int = 0) -> list[torch.Tensor]:
        """Output hiddens for each of ``steps`` unrolled draft steps.

        ``features``: ``[B, T, 3H]`` target features of positions ``0..T-1``;
        ``next_ids``: ``[B, T]``, the token after each position (pair ``t`` is
        ``(features[t], next_ids[t])``). Every step's output at ``t`` predicts token
        ``t + 2`` (label ``next_ids[t + 1]``). Step 0 is the plain causal pass over all
        positions (``[B, T, H]``). Step ``s >= 1`` at ``t`` is the ``s``-th chained draft
        step after a real prefix ending at ``t - s``: it feeds step ``s-1``'s output at
        ``t - 1`` and attends to step 0's keys at ``<= t - s`` and to step ``j``'s key at
        ``t - s + j`` (``j = 1..s``), exactly what decoding's KV cache holds. Draft steps
        are computed only at positions ``start..T-1`` (``[B, T - start, H]``): training
        sets ``start`` to where the outputs begin, since a draft step after a prefix that
        ends in the prompt never happens in decoding. Outputs at ``t < start + s`` are
        meaningless (mask them from the loss).
        """
        assert features.dim() == 3 and next_ids.dim() == 2, "features [B,T,3H], next_ids [B,T]"
        _, t, _ = features.shape
        assert 0 <= start < t, f"start must be in [0, {t}), got {start}"
        device = features.device
        embeds = self.embed(next_ids).to(features.dtype)
        hidden = self.project(features)
        q, k0, v0 = self.layer.qkv(hidden, embeds, torch.arange(t, device=device))
        out = self.layer.finish(hidden, q, k0, v0, _ttt_mask(t, t, 0, 0, device))
        outputs = [out]
        hidden = F.pad(out[:, max(start - 1, 0) : t - 1], (0, 0, 1 if start == 0 else 0, 0))
        embeds, positions = embeds[:, start:], torch.arange(start, t, device=device)
        keys, values = [k0], [v0]
        for s in range(1, steps):
            q, k, v = self.layer.qkv(hidden, embeds, positions)
            keys.append(k)
            values.append(v)
            mask = _ttt_mask(t, t - start, start, s, device)
            out = self.layer.finish(hidden, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            outputs.append(out)
            hidden = F.pad(out[:, :-1], (0, 0, 1, 0))  # next step feeds the output at t - 1
        return outputs

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Plain causal pass (step 0 of :meth:`ttt_forward`): logits ``[B, T, Vd]``."""
        return self.ttt_forward(features, next_ids, steps=1)[0]


def _ttt_mask(t: int, w: int, start: int, s: int, device: torch.device) -> torch.Tensor:
    """Bool ``[W, T + s W]``: step ``s``'s queries at ``start..start+W-1`` over the keys of
    step 0 (all ``T`` positions) and of steps ``1..s`` (positions ``start..start+W-1``)."""
    q = torch.arange(start, start + w, device=device)[:, None]
    u = torch.arange(t, device=device)[None, :]
    window = torch.arange(start, start + w, device=device)[None, :]
    blocks = [u <= q - s] + [window == q - s + j for j in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def build_draft_vocab(token_counts: torch.Tensor | None, size: int, *, vocab_size: int,
                      always: Sequence[int] = ()) -> torch.Tensor:
    """``d2t`` (sorted ``int64 [size]``): the ``always`` ids (e.g. EOS) and the most frequent.

    ``token_counts``: ``[vocab_size]`` occurrence counts, or ``None`` (then the lowest
    ids fill the vocabulary). Ties go to the lower id.
    """
    if not 0 < size <= vocab_size:
        raise ValueError(f"size must be in [1, {vocab_size}], got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    if token_counts is not None:
        assert token_counts.shape == (vocab_size,), f"token_counts must be [{vocab_size}]"
        counts += token_counts.double()
    # rank by count, ties to the lower id; forced ids first
    score = counts - torch.arange(vocab_size, dtype=torch.float64) / (2 * vocab_size)
    forced = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size]
    score[forced] = float("inf")
    chosen = torch.topk(score, size).indices
    return chosen.sort().values.to(torch.long)


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
        could be proposed (:meth:`_DraftTree.worth_expanding`): a head forward costs a
        fraction of a target step on a CPU, so the depths nobody would verify are skipped."""
        width, head = self.config.tree_width, self.head
        nodes, min_prob = self.config.tree_nodes, self.config.tree_min_prob
        tree = _DraftTree()
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

    def to(self, device: torch.device | str) -> Eagle3Speculator:
        self.head.to(device)
        self.device = torch.device(device)
        self._reset()
        return self


class _DraftTree:
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

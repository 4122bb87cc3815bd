"""The EAGLE-3 head (model only): three target layers' features -> one decoder layer -> a
reduced draft vocabulary.

For target hidden size ``H`` and draft vocabulary ``Vd``:

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

Training (:mod:`autospec.speculators.eagle3.training`) uses :meth:`Eagle3Head.ttt_forward`:
teacher-forced over whole sequences, unrolling ``steps`` draft steps exactly as decoding
attends (checked against the decode path in the tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autospec.speculators.config import Eagle3Config


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


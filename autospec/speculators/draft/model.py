"""The ``draft`` speculator: an independent small causal LM sharing the target's vocabulary.

The draft is a ``LlamaForCausalLM`` of ``num_layers`` layers built from a
:class:`DraftConfig`, with the target's vocabulary (so the target's tokenizer serves
it) and its own KV cache. With ``share_target_embeddings`` (the default) its input
embedding and LM head *are* the target's tensors (frozen, never stored in a
checkpoint): only the decoder layers and the final norm are the draft's own.

KV cache contract: the cache holds the ids in ``self._cached`` (a prefix of the
committed sequence, possibly followed by draft tokens fed during ``propose``). On
``commit`` the cache is cropped to its longest common prefix with the committed
sequence, so accepted drafts that were already fed stay in the cache and are never
re-run; everything after that prefix is fed at the next ``propose``.

Proposal tokens are on the CPU; ``probs`` (``[k, vocab]``) on the draft's device.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams, probs_from_logits
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator, draw
from autospec.speculators.config import DraftConfig

log = logging.getLogger(__name__)

_SHARED = ("model.embed_tokens.weight", "lm_head.weight")


def llama_config(config: DraftConfig) -> LlamaConfig:
    """The Hugging Face config of the draft model."""
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=False,
    )


def stored_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each stored tensor of ``config``'s draft, from a model built on the meta
    device (nothing allocated)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(config))
    skip = _SHARED if config.share_target_embeddings else ()
    return {n: tuple(t.shape) for n, t in model.state_dict().items() if n not in skip}


class DraftSpeculator(SavableSpeculator):
    """A small LM proposing by chained sampling; see the module docstring."""

    kind = "draft"

    def __init__(self, config: DraftConfig, target: Target, *, seed: int = 0) -> None:
        info = target.info
        if config.vocab_size != info.vocab_size:
            raise ValueError(
                f"draft vocab_size {config.vocab_size} != target vocab_size {info.vocab_size}"
            )
        if config.share_target_embeddings and config.hidden_size != info.hidden_size:
            raise ValueError(
                f"share_target_embeddings needs hidden_size == target's ({info.hidden_size}), "
                f"got {config.hidden_size}"
            )
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(llama_config(config))
        if config.share_target_embeddings:
            _share_embeddings(model, target)
        self.model = _cast(model, target.device, target.dtype).eval()
        self.device = target.device
        self._reset(torch.empty(0, dtype=torch.long))

    def _reset(self, committed: torch.Tensor) -> None:
        self._committed = committed.detach().to(self.device, torch.long)  # [n] settled ids
        self._cached = self._committed[:0]  # [c] ids whose K/V are in the cache
        self._cache = DynamicCache(config=self.model.config)

    # -- protocol -------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        assert prompt_ids.dim() == 1, f"prompt_ids must be [n], got {tuple(prompt_ids.shape)}"
        self._reset(prompt_ids)

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        assert tokens.dim() == 1, f"tokens must be [m], got {tuple(tokens.shape)}"
        self._committed = torch.cat([self._committed, tokens.detach().to(self.device, torch.long)])
        self._crop(_common_prefix(self._cached, self._committed))

    @torch.inference_mode()
    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        k = min(k, self.config.max_position_embeddings - len(self._committed))
        if k <= 0 or len(self._committed) == 0:
            return Proposal.empty()
        self._crop(min(_common_prefix(self._cached, self._committed), len(self._committed) - 1))
        logits = self._feed(self._committed[len(self._cached) :])
        tokens, rows = [], []
        for step in range(k):
            probs = probs_from_logits(logits, sampling)  # [vocab]
            token = probs.argmax(-1) if sampling.greedy else draw(probs, generator)
            tokens.append(token)
            rows.append(probs)
            if step + 1 < k:
                logits = self._feed(token.view(1))
        # tokens on the CPU (the engine reads them as ids), probs where they were computed
        return Proposal(tokens=torch.stack(tokens).cpu(), probs=torch.stack(rows))

    # -- cache ----------------------------------------------------------------------------
    def _feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (``[m]``, m >= 1) after the cache; float32 logits of the last one."""
        assert ids.dim() == 1 and ids.numel() >= 1, f"ids must be [m>=1], got {tuple(ids.shape)}"
        out = self.model(
            input_ids=ids.unsqueeze(0),
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._cached = torch.cat([self._cached, ids])
        return out.logits[0, -1].float()

    def _crop(self, length: int) -> None:
        if length < len(self._cached):
            # this transformers' crop takes minus the number of positions to drop
            self._cache.crop(length - len(self._cached))
            self._cached = self._cached[:length]
            assert self._cache.get_seq_length() == length

    # -- weights --------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The draft's own weights (the shared target embeddings excluded)."""
        skip = _SHARED if self.config.share_target_embeddings else ()
        return {n: t for n, t in self.model.state_dict().items() if n not in skip}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        skip = set(_SHARED) if self.config.share_target_embeddings else set()
        missing = [m for m in missing if m not in skip]
        if missing or unexpected:
            raise ValueError(f"draft weights: missing {missing}, unexpected {unexpected}")

    def hold_float32(self) -> None:
        """Float32 throughout, on frozen float32 *copies* of the borrowed target tensors:
        ``model.float()`` converts parameters in place, and the draft's embedding and LM
        head are the target's own Parameters (casting them would change the target's)."""
        model = self.model
        if self.config.share_target_embeddings:
            for owner in (model.model.embed_tokens, model.lm_head):
                owner.weight = nn.Parameter(owner.weight.detach().float().clone(),
                                            requires_grad=False)
        model.float()

    def to(self, device: torch.device | str) -> DraftSpeculator:
        self.model.to(device)
        self.device = torch.device(device)
        self._reset(self._committed)
        return self


def _share_embeddings(model: LlamaForCausalLM, target: Target) -> None:
    """Point the draft's embedding and LM head at the target's (frozen) tensors."""
    embed = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    embed.requires_grad_(False)
    head.requires_grad_(False)
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = head


def _cast(model: LlamaForCausalLM, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """``model`` on ``device`` in ``dtype``, its RoPE frequencies left in float32 (as a
    model loaded in bfloat16 has them; a cast would round them, ~0.4 rad at position 2000)."""
    rope = {name: m.inv_freq.clone() for name, m in model.named_modules()
            if isinstance(getattr(m, "inv_freq", None), torch.Tensor)}
    model.to(device=device, dtype=dtype)
    for name, inv_freq in rope.items():
        model.get_submodule(name).inv_freq = inv_freq.to(device)
    return model


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if len(diff) else n

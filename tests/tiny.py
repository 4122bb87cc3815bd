"""Tiny random-init targets for unit tests: a Llama built from a config in milliseconds,
no tokenizer, no download (``tests/conftest.py``'s ``tiny`` and ``other_tiny`` fixtures
are two of them)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autospec.engine.info import TargetInfo
from autospec.engine.target import Target


def tiny_target(*, vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 4,
                seed: int = 0, dtype: torch.dtype = torch.float32) -> Target:
    """A random-init Llama target (EOS = ``vocab_size - 1``), weights drawn from ``seed``;
    its id and revision name the seed."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                      intermediate_size=hidden_size * 2, num_hidden_layers=num_layers,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, eos_token_id=vocab_size - 1,
                      bos_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(dtype)
    info = TargetInfo(target_id=f"tiny-llama-{seed}", revision=f"tiny{seed}",
                      vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                      eos_token_ids=(vocab_size - 1,), max_position_embeddings=512)
    return Target(model, None, info)

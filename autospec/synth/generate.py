"""Batched sampling from the target: many prompts at once, left-padded, one forward a token.

:func:`sample_batch` decodes a batch of prompts together with the target's own model and the
engine's :func:`~autospec.engine.sampling.pick` (temperature, top-k and top-p shape the
distribution exactly as in serving; temperature 0 is greedy) and a seeded ``torch.Generator`` on the
target's device, so a seed reproduces a batch. Each output ends at the first EOS (included,
as the engine includes it) or at ``max_new_tokens``. Prompts are left-padded; padded
positions are masked out and positions count from each prompt's first real token.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from autospec.engine.sampling import SamplingParams, pick
from autospec.engine.target import Target


def _left_pad(prompts: list[list[int]], pad: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, longest]`` ids and their attention mask (1 = a real token)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
        mask[row, width - len(prompt):] = 1
    return ids, mask


@torch.inference_mode()
def sample_batch(target: Target, prompts: list[list[int]], params: SamplingParams,
                 generator: torch.Generator) -> list[list[int]]:
    """One continuation per prompt: sampled, or greedy at temperature 0."""
    if not prompts or any(not p for p in prompts):
        raise ValueError("every prompt of a batch needs at least one token")
    eos = set(target.info.eos_token_ids)
    ids, mask = _left_pad(prompts, pad=0, device=target.device)  # [batch, width]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, width]
    cache = DynamicCache(config=target.model.config)
    logits = target.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                          past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(params.max_new_tokens):
        tokens = pick(logits[:, -1], params, generator)  # [batch]
        for row, token in enumerate(tokens.tolist()):  # one host sync per step
            if not done[row]:
                outputs[row].append(token)
                done[row] = token in eos
        if all(done):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        positions = positions[:, -1:] + 1
        logits = target.model(input_ids=tokens[:, None], attention_mask=mask,
                              position_ids=positions, past_key_values=cache,
                              use_cache=True).logits
    return outputs

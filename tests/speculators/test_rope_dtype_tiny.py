"""A speculator cast to bfloat16 keeps its RoPE angles in float32, as it was trained."""

from __future__ import annotations

import torch

from autospec.speculators.registry import new_speculator
from tests.tiny import tiny_target

POSITIONS = torch.tensor([0, 500, 2000, 4000])


def test_eagle3_head_tiny_random_init_bf16_rope_angles_equal_float32s():
    target32 = tiny_target(vocab_size=64, seed=0)
    target16 = tiny_target(vocab_size=64, seed=0, dtype=torch.bfloat16)
    head32 = new_speculator("eagle3", target32).head
    head16 = new_speculator("eagle3", target16).head
    assert head16.fc.weight.dtype == torch.bfloat16
    want = head32.layer.angles(POSITIONS)
    got = head16.layer.angles(POSITIONS)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert head16.layer.inv_freq.dtype == torch.float32
    # a cast after building (training casts to float32 and back) keeps them too
    head32.to(torch.bfloat16).float()
    torch.testing.assert_close(head32.layer.angles(POSITIONS), want, rtol=0, atol=1e-6)


def test_draft_tiny_random_init_bf16_rope_frequencies_stay_float32():
    target32 = tiny_target(vocab_size=64, seed=0)
    target16 = tiny_target(vocab_size=64, seed=0, dtype=torch.bfloat16)
    rope32 = new_speculator("draft", target32).model.model.rotary_emb
    rope16 = new_speculator("draft", target16).model.model.rotary_emb
    torch.testing.assert_close(rope16.inv_freq.float(), rope32.inv_freq, rtol=0, atol=0)
    assert rope16.inv_freq.dtype == torch.float32
    x = torch.zeros(1, dtype=torch.bfloat16)
    cos16, _ = rope16(x, POSITIONS[None])
    cos32, _ = rope32(x.float(), POSITIONS[None])
    torch.testing.assert_close(cos16.float(), cos32, rtol=0, atol=4e-3)  # bf16 rounding only

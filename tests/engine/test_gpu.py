"""The decode loop on a CUDA device, every kind greedy and sampled (skipped without CUDA).

CI without a GPU checks the same property on a simulated accelerator
(``test_device_clean_tiny.py``); these run it for real where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from autospec.engine.costs import verify_cost
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from tests.tiny import tiny_target

from .test_device_clean_tiny import GREEDY, KINDS, PROMPT, SAMPLED, _decode

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def cuda_target(request) -> Target:
    tiny = tiny_target(vocab_size=64, seed=0, dtype=request.param)
    tiny.model.to("cuda")
    return tiny


@pytest.mark.parametrize("kind", KINDS)
def test_decode_tiny_random_init_on_cuda_for_each_kind(cuda_target, kind):
    plain = SpeculativeEngine(cuda_target).generate(PROMPT, GREEDY).token_ids
    greedy = _decode(cuda_target, kind, plain, GREEDY)
    if cuda_target.dtype == torch.float32:  # bf16 may differ at near-ties (docs/gpu.md)
        assert greedy == plain  # lossless on the device
    assert len(greedy) == GREEDY.max_new_tokens
    first = _decode(cuda_target, kind, plain, SAMPLED)
    assert first == _decode(cuda_target, kind, plain, SAMPLED)  # a fixed seed reproduces
    assert len(first) == SAMPLED.max_new_tokens


def test_verify_cost_tiny_random_init_on_cuda_is_positive(cuda_target):
    cost = verify_cost(cuda_target, sizes=(1, 4), context=32, repeats=3)
    assert all(s > 0 for s in cost.values())


def test_sampled_target_only_on_cuda_reproduces(cuda_target):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    engine = SpeculativeEngine(cuda_target)
    assert engine.generate(PROMPT, params).token_ids == engine.generate(PROMPT, params).token_ids

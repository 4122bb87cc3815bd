"""Batched sampling: left padding changes nothing, a seed reproduces, EOS ends a row."""

from __future__ import annotations

import pytest
import torch

from autospec.engine.sampling import SamplingParams
from autospec.synth.generate import sample_batch

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10], [11]]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_batch_decodes_each_prompt_as_alone(tiny) -> None:  # type: ignore[no-untyped-def]
    cold = SamplingParams(max_new_tokens=12, temperature=1e-5)  # sampling ≈ argmax
    batched = sample_batch(tiny, PROMPTS, cold, _gen(0))
    for prompt, out in zip(PROMPTS, batched, strict=True):
        ref = tiny.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                  pad_token_id=0)[0, len(prompt):].tolist()
        eos = tiny.info.eos_token_ids[0]
        assert out == (ref[: ref.index(eos) + 1] if eos in ref else ref)


def test_a_seed_reproduces_and_another_differs(tiny) -> None:  # type: ignore[no-untyped-def]
    hot = SamplingParams(max_new_tokens=16, temperature=1.0)
    first = sample_batch(tiny, PROMPTS, hot, _gen(7))
    assert sample_batch(tiny, PROMPTS, hot, _gen(7)) == first
    assert sample_batch(tiny, PROMPTS, hot, _gen(8)) != first


def test_rows_end_at_eos(tiny) -> None:  # type: ignore[no-untyped-def]
    eos = tiny.info.eos_token_ids[0]
    outs = sample_batch(tiny, PROMPTS * 8, SamplingParams(max_new_tokens=64, temperature=3.0),
                        _gen(1))
    ended = [o for o in outs if eos in o]
    assert ended, "at temperature 3 over 64 tokens some row should draw EOS"
    assert all(o.index(eos) == len(o) - 1 for o in ended)
    assert all(len(o) == 64 for o in outs if eos not in o)


def test_temperature_0_is_greedy_batched_as_alone(tiny) -> None:  # type: ignore[no-untyped-def]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    batched = sample_batch(tiny, PROMPTS, greedy, _gen(0))
    assert batched == sample_batch(tiny, PROMPTS, greedy, _gen(99))  # no randomness
    for prompt, out in zip(PROMPTS, batched, strict=True):
        assert out == sample_batch(tiny, [prompt], greedy, _gen(0))[0]


def test_empty_prompts_are_refused(tiny) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="at least one token"):
        sample_batch(tiny, [[1], []], SamplingParams(temperature=1.0), _gen(0))

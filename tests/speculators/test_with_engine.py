"""Each kind through the engine's decode loop: greedy output equals target-only output."""

from __future__ import annotations

import pytest

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.speculators.registry import new_speculator


@pytest.mark.parametrize("kind", ["ngram", "draft", "eagle3"])
def test_engine_tiny_random_init_greedy_is_lossless_with_each_kind(tiny, kind) -> None:
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompt = [3, 9, 4, 3, 9, 4, 3, 9, 1, 2, 3, 9]
    expected = SpeculativeEngine(tiny).generate(prompt, params).token_ids
    spec = new_speculator(kind, tiny)
    result = SpeculativeEngine(tiny, spec, num_speculative_tokens=4).generate(prompt, params)
    assert result.token_ids == expected
    assert result.stats.num_drafts > 0


@pytest.mark.parametrize("kind", ["draft", "eagle3"])
def test_engine_tiny_random_init_sampling_runs_with_each_kind(tiny, kind) -> None:
    params = SamplingParams(max_new_tokens=20, temperature=0.9, top_k=30, seed=3,
                            ignore_eos=True)
    spec = new_speculator(kind, tiny)
    engine = SpeculativeEngine(tiny, spec, num_speculative_tokens=3)
    first = engine.generate([5, 6, 7, 8], params).token_ids
    assert first == engine.generate([5, 6, 7, 8], params).token_ids  # seeded
    assert all(0 <= t < tiny.info.vocab_size for t in first) and len(first) == 20


@pytest.mark.parametrize("kind", ["ngram", "draft", "eagle3"])
def test_engine_tiny_random_init_one_token_prompt_with_each_kind(tiny, kind) -> None:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    expected = SpeculativeEngine(tiny).generate([7], params).token_ids
    spec = new_speculator(kind, tiny)
    got = SpeculativeEngine(tiny, spec, num_speculative_tokens=3).generate([7], params)
    assert got.token_ids == expected

"""Measured speedup (autospec/evaluate/speed.py) on a tiny random-init target: decodes are
interleaved, a round's ratio is taken against that round's target-only decode, the median
of ratios is reported, and a speculator slower than the target reads below 1×."""

from __future__ import annotations

import time

import pytest

from autospec.engine.protocol import Proposal
from autospec.engine.reference import OracleSpeculator, RandomSpeculator
from autospec.evaluate import speed
from autospec.evaluate.speed import TARGET_ONLY, measure_speedups, spread_prompts
from autospec.threads import torch_threads

K = 4
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15], [3, 1, 4, 1, 5, 9, 2]]


class SlowRandomSpeculator(RandomSpeculator):
    """A bad speculator (τ ≈ 1) that also spends ``delay`` seconds per proposal."""

    kind = "slow-random"

    def __init__(self, vocab_size: int, delay: float) -> None:
        super().__init__(vocab_size, seed=1)
        self.delay = delay

    def propose(self, k, sampling, generator) -> Proposal:  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        return super().propose(k, sampling, generator)


def test_slow_speculator_reads_below_one_times_tiny_random_init(tiny) -> None:
    m = measure_speedups(tiny, {"slow": SlowRandomSpeculator(64, delay=0.02)},
                         PROMPTS[:2], k=K, max_tokens=12, repeats=2)
    assert m.rounds == 4 and len(m.ratios["slow"]) == 4
    assert m.speedup["slow"] < 0.8, m.ratios
    assert m.tokens_per_s["slow"] < m.tokens_per_s[TARGET_ONLY]


def test_a_fast_speculator_beats_a_slow_one_in_the_same_rounds_tiny_random_init(tiny) -> None:
    # the oracle proposes the target's own greedy continuation: every draft accepted
    prompt = PROMPTS[0]
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.sampling import SamplingParams

    out = SpeculativeEngine(tiny).generate(prompt, SamplingParams(max_new_tokens=24)).token_ids
    m = measure_speedups(tiny, {"oracle": OracleSpeculator(out),
                                "slow": SlowRandomSpeculator(64, delay=0.02)},
                         [prompt], k=K, max_tokens=24, repeats=3)
    assert m.speedup["oracle"] > m.speedup["slow"], m.ratios
    assert m.speedup["oracle"] > 1.0, m.ratios


def test_rounds_interleave_and_reverse_order_and_take_the_median_of_ratios(
        tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripted rates: round 2's target-only decode is hit by a load burst (10× slower),
    which makes that round's ratio an outlier; the median ignores it, where a ratio of
    means or of sums would not."""
    calls: list[str] = []
    names = {}
    script = {TARGET_ONLY: iter([100.0, 100.0, 10.0, 100.0, 100.0, 100.0] + [100.0] * 2),
              "a": iter([150.0, 150.0, 150.0, 150.0, 150.0, 150.0] + [150.0] * 2)}

    def fake_rate(engine, prompt, params):  # type: ignore[no-untyped-def]
        name = names[id(engine.speculator)]
        if params.max_new_tokens == 9:  # timed decodes only
            calls.append(name)
            rate = next(script[name])
            drafts = 4.0 if name == "a" else 0.0
            return speed.Decoded(rate, 2.0 if name == "a" else 1.0, drafts, rate * 1.25)
        return speed.Decoded(1.0, 1.0)

    spec = RandomSpeculator(64)
    names.update({id(None): TARGET_ONLY, id(spec): "a"})
    monkeypatch.setattr(speed, "_decode_rates", fake_rate)
    m = measure_speedups(tiny, {"a": spec}, PROMPTS[:3], k=K, max_tokens=9, repeats=2)
    assert calls == [TARGET_ONLY, "a", "a", TARGET_ONLY] * 3  # back to back, order reversed
    assert m.ratios["a"] == [1.5, 1.5, 15.0, 1.5, 1.5, 1.5]
    assert m.speedup["a"] == pytest.approx(1.5)
    # a step of "a" costs τ 2 / ratio 1.5 target-only tokens; the outlier round is ignored
    assert m.step_cost["a"] == pytest.approx(2.0 / 1.5)
    assert m.projected({"a": 2.4}) == {"a": pytest.approx(2.4 / (2.0 / 1.5))}
    assert m.draft_cost["a"] == pytest.approx((2.0 / 1.5 - 1) / 4.0)  # 4 drafts a step
    assert m.projected({"a": 2.4}, {"a": 2.0}) == {"a": pytest.approx(
        2.4 / (1 + (2.0 / 1.5 - 1) / 4.0 * 2.0))}
    assert m.tokens_per_s[TARGET_ONLY] == 100.0
    assert m.decode_tokens_per_s == pytest.approx(125.0)  # target-only's, after the first


def test_prompts_are_spread_over_the_heldout_set() -> None:
    prompts = [[i] for i in range(10)]
    assert spread_prompts(prompts, 4) == [[0], [2], [5], [7]]
    assert spread_prompts(prompts[:3], 4) == prompts[:3]
    assert spread_prompts([[], [1]], 4) == [[1]]


def test_no_prompts_is_an_error_tiny_random_init(tiny) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        measure_speedups(tiny, {}, [], k=K)


def test_decode_rate_times_a_real_decode_tiny_random_init(tiny) -> None:
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.sampling import SamplingParams

    rate, tau, drafts, after = speed._decode_rates(SpeculativeEngine(tiny), PROMPTS[0],
                                                   SamplingParams(max_new_tokens=8))
    assert 0 < rate < float("inf") and tau == 1.0  # the target alone: one token a step
    assert drafts == 0.0  # nothing drafted
    assert after is not None and 0 < after < float("inf")  # 7 tokens after the first
    out = SpeculativeEngine(tiny).generate(PROMPTS[0], SamplingParams(max_new_tokens=12))
    _, tau, drafts, _ = speed._decode_rates(
        SpeculativeEngine(tiny, OracleSpeculator(out.token_ids), K), PROMPTS[0],
        SamplingParams(max_new_tokens=12))
    assert tau > 2  # every draft accepted: k + 1 a step, but for the last, shorter steps
    assert 0 < drafts <= K and drafts == pytest.approx(tau - 1)  # all accepted


def test_the_measurement_records_the_threads_it_ran_on_tiny_random_init(tiny) -> None:
    with torch_threads(1):
        m = measure_speedups(tiny, {"r": RandomSpeculator(64)}, PROMPTS[:1], k=K,
                             max_tokens=6, repeats=1)
    assert m.threads == 1

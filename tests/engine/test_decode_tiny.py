"""The decode loop on tiny random-init targets: lossless for every speculator, τ, stops."""

import itertools

import pytest
import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.interface import RequestError
from autospec.engine.reference import OracleSpeculator, RandomSpeculator
from autospec.engine.sampling import SamplingParams, probs_from_logits
from tests.tiny import tiny_target

PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 7, 9, 10, 11, 7, 7], list(range(3, 40))]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=64, seed=0)


def _target_only(target, prompt, params=GREEDY):
    return SpeculativeEngine(target).generate(prompt, params)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_tiny_random_init_tau_is_k_plus_one(target, k):
    params = SamplingParams(max_new_tokens=1 + 6 * (k + 1), ignore_eos=True)
    for prompt in PROMPTS:
        plain = _target_only(target, prompt, params).token_ids
        res = SpeculativeEngine(target, OracleSpeculator(plain), k).generate(prompt, params)
        assert res.token_ids == plain
        assert res.stats.num_drafts == 6
        assert res.stats.accepted_per_position == [6] * k
        assert res.stats.tau == k + 1


@pytest.mark.parametrize("k", [1, 4])
def test_random_speculator_tiny_random_init_is_lossless_and_tau_near_one(target, k):
    for prompt in PROMPTS:
        plain = _target_only(target, prompt).token_ids
        res = SpeculativeEngine(target, RandomSpeculator(64, seed=3), k).generate(prompt, GREEDY)
        assert res.token_ids == plain
        assert res.stats.tau < 1.3
        assert res.stats.num_draft_tokens > 0


def test_target_only_counts_one_token_per_step(target):
    res = _target_only(target, PROMPTS[0])
    assert len(res.token_ids) == 40 and res.finish_reason == "length"
    assert res.stats.num_drafts == 39 and res.stats.tau == 1.0


def test_streaming_yields_the_same_tokens(target):
    plain = _target_only(target, PROMPTS[1]).token_ids
    gen = SpeculativeEngine(target, OracleSpeculator(plain), 3).stream(PROMPTS[1], GREEDY)
    chunks = list(gen)
    assert list(itertools.chain(*chunks)) == plain == gen.result.token_ids
    assert len(chunks) < len(plain)  # several tokens per step


def test_eos_stops_and_is_included():
    target = tiny_target(vocab_size=64, seed=0)
    plain = _target_only(target, PROMPTS[0]).token_ids
    eos = plain[5]
    target.info = type(target.info)(**{**target.info.__dict__, "eos_token_ids": (eos,)})
    params = SamplingParams(max_new_tokens=40)
    first = plain.index(eos)
    for spec in (None, OracleSpeculator(plain)):
        res = SpeculativeEngine(target, spec, 4).generate(PROMPTS[0], params)
        assert res.token_ids == plain[: first + 1] and res.finish_reason == "stop"


def test_max_new_tokens_is_exact_with_speculation(target):
    plain = _target_only(target, PROMPTS[0]).token_ids
    for n in (1, 2, 7):
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        res = SpeculativeEngine(target, OracleSpeculator(plain), 5).generate(PROMPTS[0], params)
        assert res.token_ids == plain[:n]


def test_prompt_longer_than_context_is_a_clear_error(target):
    with pytest.raises(RequestError, match="exceeds the target's context"):
        _target_only(target, list(range(1, 60)) * 10)
    with pytest.raises(RequestError, match="empty"):
        _target_only(target, [])


def test_seeded_sampling_reproduces(target):
    params = SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.95, seed=7,
                            ignore_eos=True)
    spec = RandomSpeculator(64, seed=1)
    a = SpeculativeEngine(target, spec, 3).generate(PROMPTS[0], params).token_ids
    b = SpeculativeEngine(target, spec, 3).generate(PROMPTS[0], params).token_ids
    assert a == b


def _exact_pair_distribution(target, prompt, params):
    """P(t2, t3 | prompt) of the target alone, by enumerating every t1, t2."""
    vocab = target.info.vocab_size
    with torch.inference_mode():
        p1 = probs_from_logits(target.model(torch.tensor([prompt])).logits[0, -1], params)
        one = torch.tensor([[*prompt, a] for a in range(vocab)])
        p2 = probs_from_logits(target.model(one).logits[:, -1], params)  # [t1, t2]
        two = torch.tensor([[*prompt, a, b] for a in range(vocab) for b in range(vocab)])
        p3 = probs_from_logits(target.model(two).logits[:, -1], params)  # [t1 * V + t2, t3]
    joint = p1[:, None, None] * p2[:, :, None] * p3.reshape(vocab, vocab, vocab)
    return joint.sum(0)  # [t2, t3]


def test_rejection_sampling_engine_matches_target_distribution():
    """Tokens 2 and 3 are drafted together (k = 2) by a bad random speculator and
    verified; their joint law must be the target's."""
    target = tiny_target(vocab_size=6, hidden_size=16, seed=4)
    base = dict(max_new_tokens=4, temperature=1.0, ignore_eos=True)
    exact = _exact_pair_distribution(target, [1, 2, 3], SamplingParams(**base)).flatten()
    engine = SpeculativeEngine(target, RandomSpeculator(6, seed=2, peaked=2.0), 2)
    n = 3000
    counts = torch.zeros(36)
    drafted = 0
    for seed in range(n):
        res = engine.generate([1, 2, 3], SamplingParams(**base, seed=seed))
        drafted += res.stats.num_draft_tokens
        _, t2, t3, _ = res.token_ids
        counts[t2 * 6 + t3] += 1
    assert drafted >= 2 * n  # every request verified 2 drafts right after token 1
    expected = exact * n
    keep = expected > 5
    chi2 = float((((counts - expected) ** 2) / expected)[keep].sum())
    # chi-square with <= 35 degrees of freedom: 0.1 % critical value is 66.6
    assert chi2 < 66.6, chi2
    assert counts[~keep].sum() < 5 + expected[~keep].sum() * 3


def test_logit_bias_tiny_random_init_is_lossless_and_moves_the_target(target):
    bias = SamplingParams(max_new_tokens=30, ignore_eos=True,
                          logit_bias=((5, 100.0), (6, 100.0), (7, -100.0)))
    for prompt in PROMPTS:
        plain = _target_only(target, prompt, bias).token_ids
        assert set(plain) <= {5, 6}  # +100 wins every argmax, -100 never does
        oracle = SpeculativeEngine(target, OracleSpeculator(plain), 4).generate(prompt, bias)
        assert oracle.token_ids == plain  # verified against the biased target: all accepted
        assert oracle.stats.num_accepted_tokens == oracle.stats.num_draft_tokens > 0
        drafted = SpeculativeEngine(target, RandomSpeculator(64, seed=1), 3).generate(prompt,
                                                                                       bias)
        assert drafted.token_ids == plain


def test_logit_bias_shapes_p_and_q_alike_tiny_random_init():
    logits = torch.zeros(2, 8)
    params = SamplingParams(temperature=1.0, logit_bias=((3, 2.0),))
    probs = probs_from_logits(logits, params)
    assert torch.allclose(probs[:, 3] / probs[:, 0], torch.full((2,), float(torch.e ** 2)))


def test_penalties_tiny_random_init_are_lossless_and_change_the_output(target):
    plain = SamplingParams(max_new_tokens=30, ignore_eos=True)
    penal = SamplingParams(max_new_tokens=30, ignore_eos=True, frequency_penalty=2.0,
                           presence_penalty=1.0)
    changed = 0
    for prompt in PROMPTS:
        want = _target_only(target, prompt, penal).token_ids
        changed += want != _target_only(target, prompt, plain).token_ids
        oracle = SpeculativeEngine(target, OracleSpeculator(want), 4).generate(prompt, penal)
        assert oracle.token_ids == want  # each verified row counts the drafts before it
        assert oracle.stats.num_accepted_tokens == oracle.stats.num_draft_tokens > 0
        drafted = SpeculativeEngine(target, RandomSpeculator(64, seed=2), 3).generate(prompt,
                                                                                       penal)
        assert drafted.token_ids == want
    assert changed  # the penalties do move the target's choices


def test_penalties_count_what_came_before_each_row_only():
    from autospec.engine.sampling import penalized

    logits = torch.zeros(3, 6)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=1.0)
    out = penalized(logits, params, generated=[2, 2], chain=[3, 2])
    assert out[0].tolist() == [0, 0, -2.5, 0, 0, 0]  # 2 seen twice
    assert out[1].tolist() == [0, 0, -2.5, -1.5, 0, 0]  # and draft 3 once
    assert out[2].tolist() == [0, 0, -3.5, -1.5, 0, 0]  # and draft 2 again
    assert penalized(logits, SamplingParams(), [1], [1, 1]) is logits


def test_drafts_accepted_past_the_end_are_not_counted_tiny_random_init():
    """EOS among a step's accepted drafts ends the output there: the drafts after it were
    never emitted and replay (which scores the logged ids) does not count them, so the live
    count must not either (live τ would read above the shadow τ it is compared with). The
    EOS itself counts as the step's own token, not an accepted draft (the target's own token
    there is the same EOS): output tokens = 1 + steps + accepted, as for every request."""
    target = tiny_target(vocab_size=64, seed=0)
    plain = _target_only(target, PROMPTS[0]).token_ids
    end = next(j for j in (2, 3) if plain[j] not in plain[:j])  # inside step 1's 4 drafts
    target.info = type(target.info)(**{**target.info.__dict__, "eos_token_ids": (plain[end],)})
    res = SpeculativeEngine(target, OracleSpeculator(plain), 4).generate(
        PROMPTS[0], SamplingParams(max_new_tokens=40))
    assert res.token_ids == plain[: end + 1]
    assert res.stats.num_drafts == 1 and res.stats.num_accepted_tokens == end - 1
    assert res.stats.accepted_per_position == [1] * (end - 1) + [0] * (5 - end)
    assert len(res.token_ids) == 1 + res.stats.num_drafts + res.stats.num_accepted_tokens

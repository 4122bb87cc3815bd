"""Which (feature position, target token) pairs the eagle3 loss counts, step by step.

A deployed head drafts only after the prompt: its first draft reads the features of the
last prompt position (``prompt_len - 1``) and the first output token. So step ``s`` of
training-time test counts pair ``t`` only where its real prefix ends at or after that
pair (``t - s >= prompt_len - 1``) and the pair has a teacher (``t <= len - 2``). Decoding
stops at the output's first EOS, so no pair whose context or chain holds it counts.
"""

from __future__ import annotations

import torch

from autospec.speculators.registry import new_speculator
from autospec.train.data import TrainSequence
from autospec.train.features import extract_features
from autospec.train.kinds import TraineeOptions, recipe

# (prompt length, output length, ends in EOS): two prompt lengths, so the batch is padded
# and the draft steps start at the shorter prompt's end
SHAPES = [(6, 5, False), (9, 4, True)]
STEPS = 3
EOS = 63  # the tiny target's


def _sequences(shapes=SHAPES, eos_at=((), ())) -> list[TrainSequence]:
    """Random sequences of ``shapes``; ``eos_at[row]``: more indices holding EOS."""
    gen = torch.Generator().manual_seed(7)
    seqs = []
    for (p, o, eos), more in zip(shapes, eos_at, strict=True):
        ids = torch.randint(0, EOS, (p + o,), generator=gen)
        if eos:
            ids[-1] = EOS
        ids[list(more)] = EOS
        seqs.append(TrainSequence(ids=ids.tolist(), prompt_len=p))
    return seqs


def _trainee_and_batch(tiny, seqs=None):
    seqs = seqs or _sequences()
    spec = new_speculator("eagle3", tiny, draft_vocab_size=64)  # every teacher teachable
    kind = recipe("eagle3")
    kind.prepare(spec, seqs, tiny, None)
    trainee = kind.trainee(spec, TraineeOptions(ttt_steps=STEPS, loss="kl",
                                                eos_ids=tiny.info.eos_token_ids))
    cache = extract_features(tiny, seqs, feature_layers=spec.feature_layers)
    return trainee, trainee.make_batch(cache, list(range(len(seqs))))


def test_eagle3_tiny_random_init_counts_pairs_from_the_last_prompt_position(tiny) -> None:
    trainee, batch = _trainee_and_batch(tiny)
    width = batch["valid"].shape[1]
    expected = torch.zeros(len(SHAPES), width, dtype=torch.bool)
    pairs = []  # pairs (features[t], ids[t + 1]) counted at step 0, per sequence
    for row, (p, o, eos) in enumerate(SHAPES):
        last = p + o - 2 - eos  # a context ending in EOS is never drafted from
        expected[row, p - 1 : last + 1] = True  # ids[t + 1] is an output token: t >= p - 1
        pairs.append(last + 1 - (p - 1))
    assert torch.equal(batch["valid"], expected)

    top_lp = batch["top_logprobs"].clone().requires_grad_()
    loss, correct, counted = trainee(**{**batch, "top_logprobs": top_lp})
    # step s: real prefixes ending at t - s >= prompt_len - 1, so one pair fewer a step
    assert counted.tolist() == [sum(n - s for n in pairs) for s in range(STEPS)]
    assert (correct <= counted).all()
    loss.backward()  # the loss reads a teacher exactly at the counted pairs
    assert top_lp.grad is not None
    assert torch.equal(top_lp.grad.abs().sum(-1) > 0, expected)


def test_eagle3_tiny_random_init_counts_no_pair_at_or_past_a_mid_output_eos(tiny) -> None:
    """An output logged past an EOS (``ignore_eos``): with the first output EOS at ``e``, step
    ``s`` counts pair ``t`` for ``prompt_len - 1 + s <= t <= e - 2`` (the last predicts the
    EOS). Pairs after it, and chains fed the EOS mid-way (step 2 at ``t = e``: prefix ending
    at ``e - 2``, chain ``ids[e], ids[e + 1]``), do not. An EOS in the prompt (a chat
    template's end of turn) changes nothing."""
    p, o, e = 6, 10, 9  # output ids[6..15], EOS at 9 and again at the end
    seqs = _sequences([(p, o, True), (8, 4, False)], eos_at=((2, e), ()))
    trainee, batch = _trainee_and_batch(tiny, seqs)
    width = batch["valid"].shape[1]
    expected = torch.zeros(2, width, dtype=torch.bool)
    expected[0, p - 1 : e - 1] = True  # pairs 5..7: tokens 6..8 in, 7..9 predicted
    expected[1, 8 - 1 : 8 + 4 - 1] = True  # no EOS: every output pair, the last one too
    assert torch.equal(batch["valid"], expected)

    top_lp = batch["top_logprobs"].clone().requires_grad_()
    loss, _, counted = trainee(**{**batch, "top_logprobs": top_lp})
    assert counted.tolist() == [(e - 1 - (p - 1) - s) + (4 - s) for s in range(STEPS)]
    loss.backward()
    assert torch.equal(top_lp.grad.abs().sum(-1) > 0, expected)


def test_eagle3_tiny_random_init_last_pair_of_a_cut_output_reads_the_target_after_it(tiny):
    """An output cut short by max_tokens (no EOS): its last pair ``L - 2`` predicts token
    ``L``, which is not in the sequence, but its teacher is: the target's distribution after
    the whole output (the feature pass computes every position's), as decoding with a larger
    max_tokens would verify a draft there."""
    seqs = _sequences()
    _, batch = _trainee_and_batch(tiny, seqs)
    n = len(seqs[0].ids)
    assert bool(batch["valid"][0, n - 2])
    with torch.no_grad():
        after = torch.log_softmax(tiny.model(torch.tensor([seqs[0].ids])).logits[0, -1], -1)
    values, indices = after.topk(batch["top_ids"].shape[-1])
    assert torch.equal(batch["top_ids"][0, n - 2].cpu(), indices)
    assert torch.allclose(batch["top_logprobs"][0, n - 2].cpu(), values, atol=4e-3)

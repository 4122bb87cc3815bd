"""draft: a tiny random-init Llama with its own KV cache, rolled back on commit."""

from __future__ import annotations

import pytest
import torch

from autospec.engine.sampling import SamplingParams
from autospec.speculators.draft import DraftSpeculator
from autospec.speculators.registry import new_speculator
from autospec.train.data import TrainSequence
from autospec.train.features import extract_features
from autospec.train.kinds import TraineeOptions, recipe

from .helpers import assert_valid, feed_from_scratch

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=20, top_p=0.9)


def _draft(target) -> DraftSpeculator:
    spec = new_speculator("draft", target)
    assert isinstance(spec, DraftSpeculator)
    return spec


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_draft_tiny_random_init_proposes_valid_tokens(tiny, sequence, params) -> None:
    spec = _draft(tiny)
    spec.begin(sequence[:10], None)
    spec.commit(sequence[10:11], None)
    proposal = spec.propose(5, params, torch.Generator().manual_seed(0))
    assert proposal.num_tokens == 5
    assert_valid(proposal, 5, tiny.info.vocab_size)
    if params.greedy:
        assert bool((proposal.probs.max(-1).values == 1).all())


def test_draft_tiny_random_init_shares_the_target_embeddings(tiny) -> None:
    spec = _draft(tiny)
    assert spec.model.model.embed_tokens.weight is tiny.model.get_input_embeddings().weight
    assert "model.embed_tokens.weight" not in spec.state_tensors()
    assert "lm_head.weight" not in spec.state_tensors()


def test_draft_tiny_random_init_keeps_accepted_drafts_in_cache(tiny, sequence) -> None:
    spec = _draft(tiny)
    spec.begin(sequence[:8], None)
    spec.commit(sequence[8:9], None)
    drafts = spec.propose(4, GREEDY, None).tokens
    assert spec._cache.get_seq_length() == 9 + 3  # committed + the 3 drafts fed back
    spec.commit(torch.cat([drafts[:2], torch.tensor([5])]), None)  # 2 accepted + bonus
    assert spec._cache.get_seq_length() == 9 + 2  # accepted drafts stay; the rest cropped


def test_draft_tiny_random_init_rollback_matches_fresh(tiny, sequence) -> None:
    """After proposals and partial commits, proposals equal a fresh speculator's."""
    spec, fresh = _draft(tiny), _draft(tiny)
    n = 6
    spec.begin(sequence[:n], None)
    committed = [int(sequence[n])]
    spec.commit(sequence[n : n + 1], None)
    for accepted, bonus in [(2, 7), (0, 11), (4, 3), (1, 9)]:
        drafts = spec.propose(4, GREEDY, None).tokens
        settled = [*drafts[:accepted].tolist(), bonus]
        committed += settled
        spec.commit(torch.tensor(settled), None)
        seq = torch.cat([sequence[:n], torch.tensor(committed)])
        feed_from_scratch(fresh, seq, n, None)
        ours, theirs = spec.propose(4, GREEDY, None), fresh.propose(4, GREEDY, None)
        assert ours.tokens.tolist() == theirs.tokens.tolist()
        torch.testing.assert_close(ours.probs, theirs.probs)


def test_draft_tiny_random_init_sampling_is_seeded(tiny, sequence) -> None:
    spec = _draft(tiny)
    runs = []
    for _ in range(2):
        spec.begin(sequence[:10], None)
        spec.commit(sequence[10:11], None)
        runs.append(spec.propose(5, SAMPLED, torch.Generator().manual_seed(7)).tokens.tolist())
    assert runs[0] == runs[1]


def test_draft_tiny_random_init_respects_max_positions(tiny, sequence) -> None:
    spec = new_speculator("draft", tiny, max_position_embeddings=16)
    spec.begin(sequence[:12], None)
    spec.commit(sequence[12:14], None)
    assert spec.propose(5, GREEDY, None).num_tokens == 2


def test_draft_tiny_random_init_propose_twice_without_commit_repeats(tiny, sequence) -> None:
    spec = _draft(tiny)
    spec.begin(sequence[:10], None)
    spec.commit(sequence[10:11], None)
    first = spec.propose(4, GREEDY, None).tokens.tolist()
    assert spec.propose(4, GREEDY, None).tokens.tolist() == first
    assert spec.propose(0, GREEDY, None).num_tokens == 0


def test_draft_tiny_random_init_counts_no_position_past_a_mid_output_eos(tiny) -> None:
    """Position ``t`` predicts token ``t + 1``: from ``prompt_len - 1`` up to the output's
    first EOS (predicted, counted), none after it (an output logged past EOS, ignore_eos);
    an EOS in the prompt changes nothing."""
    eos = tiny.info.eos_token_ids[0]
    ids = torch.randint(0, eos, (14,), generator=torch.Generator().manual_seed(3))
    ids[[1, 8, 13]] = eos  # prompt ids[0..4]; output ids[5..13], first EOS at 8
    seq = TrainSequence(ids=ids.tolist(), prompt_len=5)
    spec = _draft(tiny)
    kind = recipe("draft")
    kind.prepare(spec, [seq], tiny, None)
    trainee = kind.trainee(spec, TraineeOptions(eos_ids=tiny.info.eos_token_ids))
    batch = trainee.make_batch(extract_features(tiny, [seq]), [0])
    expected = torch.zeros(1, 14, dtype=torch.bool)
    expected[0, 4:8] = True  # contexts ending at 4..7 predict 5..8 (8: the EOS)
    assert torch.equal(batch["valid"].cpu(), expected)
    assert trainee(**batch)[2].tolist() == [4]

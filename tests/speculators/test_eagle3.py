"""eagle3: a head on a tiny random-init target's features, its KV cache and its training pass."""

from __future__ import annotations

import pytest
import torch

from autospec.engine.sampling import SamplingParams
from autospec.speculators.eagle3 import Eagle3Speculator, HeadKVCache, build_draft_vocab
from autospec.speculators.registry import new_speculator

from .helpers import assert_valid, feed_from_scratch, target_features

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


def _eagle(target, draft_vocab_size: int = 32) -> Eagle3Speculator:
    """A chain-drafting head (trees: test_eagle3_tree.py)."""
    spec = new_speculator("eagle3", target, draft_vocab_size=draft_vocab_size, tree_nodes=0)
    assert isinstance(spec, Eagle3Speculator)
    return spec


@pytest.fixture(scope="module")
def feats(tiny, sequence) -> torch.Tensor:
    return target_features(tiny, sequence, _eagle(tiny).feature_layers)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_eagle3_tiny_random_init_proposes_valid_tokens(tiny, sequence, feats, params) -> None:
    spec = _eagle(tiny)
    feed_from_scratch(spec, sequence[:12], 10, feats[:12])
    proposal = spec.propose(5, params, torch.Generator().manual_seed(0))
    assert proposal.num_tokens == 5
    assert_valid(proposal, 5, tiny.info.vocab_size)
    # only draft-vocabulary ids, and no mass outside it; greedy drafts are one-hot (None)
    assert bool(spec.head.t2d[proposal.tokens].all())
    if params.greedy:
        assert proposal.probs is None
    else:
        assert float(proposal.probs[:, ~spec.head.t2d].sum()) == 0.0


def test_eagle3_tiny_random_init_draft_vocab_keeps_eos(tiny) -> None:
    spec = _eagle(tiny, draft_vocab_size=16)
    eos = tiny.info.eos_token_ids[0]
    assert eos in spec.head.d2t.tolist()
    assert int(spec.head.t2d.sum()) == 16


def test_eagle3_tiny_random_init_stores_no_embedding(tiny) -> None:
    spec = _eagle(tiny)
    tensors = spec.state_tensors()
    assert "embed_weight" not in tensors and "t2d" not in tensors
    assert tensors["d2t"].shape == (32,)
    assert spec.head.embed_weight.data_ptr() == tiny.model.get_input_embeddings().weight.data_ptr()


def test_eagle3_tiny_random_init_rollback_matches_fresh(tiny, sequence, feats) -> None:
    """After proposals and commits of real pairs, proposals equal a fresh speculator's."""
    spec, fresh = _eagle(tiny), _eagle(tiny)
    n, pos = 8, 9
    feed_from_scratch(spec, sequence[:pos], n, feats[:pos])
    for m in (3, 1, 4, 2):
        spec.propose(4, GREEDY, None)  # speculative steps enter the cache, then roll back
        spec.commit(sequence[pos : pos + m], feats[pos - 1 : pos + m - 1])
        pos += m
        feed_from_scratch(fresh, sequence[:pos], n, feats[:pos])
        ours, theirs = spec.propose(4, GREEDY, None), fresh.propose(4, GREEDY, None)
        assert ours.tokens.tolist() == theirs.tokens.tolist()
        assert spec._real == fresh._real == pos - 1  # one real pair per settled position


def test_eagle3_tiny_random_init_sampled_rollback_matches_fresh(tiny, sequence, feats) -> None:
    spec, fresh = _eagle(tiny), _eagle(tiny)
    feed_from_scratch(spec, sequence[:12], 8, feats[:12])
    spec.propose(4, SAMPLED, torch.Generator().manual_seed(1))
    spec.commit(sequence[12:15], feats[11:14])
    feed_from_scratch(fresh, sequence[:15], 8, feats[:15])
    ours = spec.propose(4, SAMPLED, torch.Generator().manual_seed(2))
    theirs = fresh.propose(4, SAMPLED, torch.Generator().manual_seed(2))
    assert ours.tokens.tolist() == theirs.tokens.tolist()
    torch.testing.assert_close(ours.probs, theirs.probs, atol=1e-5, rtol=1e-4)


def test_eagle3_tiny_random_init_refuses_missing_features(tiny, sequence) -> None:
    spec = _eagle(tiny)
    with pytest.raises(ValueError, match="features"):
        spec.begin(sequence[:5], None)


def test_eagle3_tiny_random_init_ttt_forward_matches_decoding(tiny, sequence, feats) -> None:
    """Training's unrolled steps see exactly what chained decoding steps see."""
    head = _eagle(tiny).head
    steps, t = 3, 20
    next_ids = sequence[1 : t + 1]
    with torch.no_grad():
        train = head.ttt_forward(feats[None, :t], next_ids[None], steps=steps)
        for p in (0, 5, 11):  # the real prefix ends at p; steps chain from there
            cache = HeadKVCache(head.config.num_kv_heads, head.config.head_dim,
                                device=torch.device("cpu"), dtype=torch.float32, capacity=4)
            out = head.step_with_features(feats[: p + 1], next_ids[: p + 1], cache)
            torch.testing.assert_close(head.logits(out), train[0][0, : p + 1])
            hidden = out[-1:]
            for s in range(1, steps):  # teacher-forced tokens, the head's own hiddens
                hidden = head.step_with_own_hidden(hidden, next_ids[p + s : p + s + 1], cache)
                torch.testing.assert_close(head.logits(hidden)[0], train[s][0, p + s])


def test_eagle3_tiny_random_init_ttt_draft_steps_from_start_match_the_full_unroll(
        tiny, sequence, feats) -> None:
    """Draft steps computed only from ``start`` on equal the full unroll's there."""
    head = _eagle(tiny).head
    steps, t, start = 3, 20, 7
    next_ids = sequence[None, 1 : t + 1]
    with torch.no_grad():
        full = head.ttt_hidden(feats[None, :t], next_ids, steps=steps)
        part = head.ttt_hidden(feats[None, :t], next_ids, steps=steps, start=start)
    torch.testing.assert_close(part[0], full[0])
    for s in range(1, steps):
        assert part[s].shape[1] == t - start
        torch.testing.assert_close(part[s][:, s:], full[s][:, start + s :])


def test_eagle3_tiny_random_init_ttt_forward_trains(tiny, sequence, feats) -> None:
    head = _eagle(tiny, draft_vocab_size=64).head
    features = feats[None, :20].clone()  # target features are inference-mode tensors
    logits = head.ttt_forward(features, sequence[None, 1:21], steps=2)
    loss = sum(torch.nn.functional.cross_entropy(x[0, s:-1], sequence[s + 2 : 21])
               for s, x in enumerate(logits))
    loss.backward()
    assert head.fc.weight.grad is not None and head.lm_head.weight.grad is not None


def test_build_draft_vocab_takes_frequent_ids_and_forced_ones() -> None:
    counts = torch.zeros(10)
    counts[[7, 2, 5]] = torch.tensor([9.0, 5.0, 5.0])
    d2t = build_draft_vocab(counts, 4, vocab_size=10, always=[9])
    assert d2t.tolist() == [2, 5, 7, 9]  # ties go to the lower id; sorted
    assert build_draft_vocab(None, 3, vocab_size=10).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="size"):
        build_draft_vocab(None, 11, vocab_size=10)


def test_eagle3_tiny_random_init_propose_twice_without_commit_repeats(tiny, sequence,
                                                                      feats) -> None:
    spec = _eagle(tiny)
    feed_from_scratch(spec, sequence[:12], 10, feats[:12])
    first = spec.propose(4, GREEDY, None).tokens.tolist()
    assert spec.propose(4, GREEDY, None).tokens.tolist() == first
    assert spec.propose(0, GREEDY, None).num_tokens == 0


def test_eagle3_tiny_random_init_long_prompt_grows_the_cache(tiny) -> None:
    spec = _eagle(tiny)
    ids = torch.arange(300) % 60
    spec.begin(ids, target_features(tiny, ids, spec.feature_layers))
    spec.commit(torch.tensor([4]), target_features(tiny, ids, spec.feature_layers)[-1:])
    assert spec.propose(3, GREEDY, None).num_tokens == 3
    assert spec._real == 300


def _with_index(spec: Eagle3Speculator, tiny, docs) -> Eagle3Speculator:
    from autospec.speculators.config import SuffixConfig
    from autospec.speculators.suffix import suffix_from_documents

    spec.attach_suffix(suffix_from_documents(SuffixConfig.for_target(tiny.info), docs, tiny))
    return spec


def test_eagle3_tiny_random_init_proposes_the_suffix_index_where_it_is_confident(
        tiny, sequence, feats) -> None:
    """Traffic that always continued this way: the index's path, not the (random) head's."""
    docs = [(sequence[:10].tolist(), sequence[10:].tolist())] * 3
    spec = _with_index(_eagle(tiny), tiny, docs)
    assert spec.config.suffix_tokens == spec.suffix.corpus_tokens > 0
    head_only = _eagle(tiny)
    for end in (14, 20, 27):
        feed_from_scratch(spec, sequence[:end], 10, feats[:end])
        feed_from_scratch(head_only, sequence[:end], 10, feats[:end])
        proposal = spec.propose(5, GREEDY, None)
        assert proposal.tokens.tolist() == sequence[end : end + 5].tolist()
        assert proposal.probs is None
        assert head_only.propose(5, GREEDY, None).tokens.tolist() != proposal.tokens.tolist()
        # the threshold is a share of k: three sure tokens are enough at k = 3
        assert spec.propose(3, GREEDY, None).tokens.tolist() == sequence[end : end + 3].tolist()


def test_eagle3_tiny_random_init_pairs_queued_behind_suffix_proposals_reach_the_head(
        tiny, sequence, feats) -> None:
    """While the index proposes, real pairs wait in the queue; the next head proposal runs
    them in one forward and drafts exactly what a head fed step by step drafts."""
    docs = [(sequence[:10].tolist(), sequence[10:].tolist())] * 3
    spec, head_only = _with_index(_eagle(tiny), tiny, docs), _eagle(tiny)
    for s in (spec, head_only):
        feed_from_scratch(s, sequence[:12], 10, feats[:12])
    pos = 12
    for m in (2, 3, 1):  # three steps the index proposes (its path is the sequence itself)
        assert spec.propose(5, GREEDY, None).tokens.tolist() == sequence[pos : pos + 5].tolist()
        head_only.propose(5, GREEDY, None)
        for s in (spec, head_only):
            s.commit(sequence[pos : pos + m], feats[pos - 1 : pos + m - 1])
        pos += m
    assert spec._real < head_only._real == pos - 2  # spec's pairs since the start still queued
    spec.config = spec.config.model_copy(update={"suffix_threshold": None})
    ours, theirs = spec.propose(4, GREEDY, None), head_only.propose(4, GREEDY, None)
    assert ours.tokens.tolist() == theirs.tokens.tolist()
    assert spec._real == head_only._real == pos - 1


def test_eagle3_tiny_random_init_below_the_threshold_the_head_drafts(tiny, sequence,
                                                                     feats) -> None:
    """An index that never saw this text, or a threshold of null: the head's own chain."""
    unseen = [([1, 2, 3], [4, 5, 6, 7])]
    spec = _with_index(_eagle(tiny), tiny, unseen)
    seen = [(sequence[:10].tolist(), sequence[10:].tolist())]
    disabled = _with_index(_eagle(tiny), tiny, seen)
    disabled.config = disabled.config.model_copy(update={"suffix_threshold": None})
    head_only = _eagle(tiny)
    for s in (spec, disabled, head_only):
        feed_from_scratch(s, sequence[:16], 10, feats[:16])
    want = head_only.propose(5, GREEDY, None).tokens.tolist()
    assert spec.propose(5, GREEDY, None).tokens.tolist() == want
    assert disabled.propose(5, GREEDY, None).tokens.tolist() == want


def test_eagle3_tiny_random_init_stores_its_suffix_index(tiny, sequence, feats,
                                                          tmp_path) -> None:
    from autospec.speculators.checkpoint import load_speculator, save_speculator

    docs = [(sequence[:10].tolist(), sequence[10:].tolist())]
    spec = _with_index(_eagle(tiny), tiny, docs)
    save_speculator(spec, tmp_path)
    loaded = load_speculator(tmp_path, tiny)
    assert loaded.config == spec.config
    assert {"suffix.tokens", "suffix.suffix_array"} <= set(loaded.state_tensors())
    for s in (spec, loaded):
        feed_from_scratch(s, sequence[:18], 10, feats[:18])
    assert loaded.propose(5, GREEDY, None).tokens.tolist() == sequence[18:23].tolist()
    dropped = _eagle(tiny)
    dropped.attach_suffix(None)
    assert dropped.config.suffix_tokens == 0 and "suffix.tokens" not in dropped.state_tensors()


def test_eagle3_tiny_random_init_bf16_target_gets_a_bf16_head() -> None:
    """The head runs in the target's dtype and shares its embedding table."""
    from tests.tiny import tiny_target

    target = tiny_target(dtype=torch.bfloat16)
    spec = _eagle(target)
    assert spec.head.fc.weight.dtype == torch.bfloat16
    embed = target.model.get_input_embeddings().weight
    assert spec.head.embed_weight.data_ptr() == embed.data_ptr()
    seq = torch.arange(1, 13)
    feats = target_features(target, seq, spec.feature_layers)
    assert feats.dtype == torch.bfloat16
    feed_from_scratch(spec, seq, 8, feats)
    assert spec.propose(4, GREEDY, None).num_tokens == 4


def test_eagle3_tiny_random_init_tree_carries_an_unsure_index_path_as_a_branch(
        tiny, sequence, feats) -> None:
    """Below the threshold a greedy tree is the head's, plus the index's path as a branch."""
    from autospec.speculators.suffix import expected_accepted

    forked = sequence[10:18].tolist() + [63 - t for t in sequence[18:].tolist()]
    docs = [(sequence[:10].tolist(), sequence[10:].tolist()), (sequence[:10].tolist(), forked)]
    spec = _with_index(_eagle(tiny), tiny, docs)
    spec.config = spec.config.model_copy(update={"suffix_threshold": 1.0, "tree_nodes": 6,
                                                       "tree_min_prob": 0.0})
    feed_from_scratch(spec, sequence[:16], 10, feats[:16])
    best = spec.suffix.best_path(5)
    assert len(best) == 5 and expected_accepted(best) < 5  # the traffic forked: not sure
    path = [t for t, _ in best]
    proposal = spec.propose(5, GREEDY, None)
    assert proposal.is_tree and 6 <= proposal.num_tokens <= 11
    tokens, parents = proposal.tokens.tolist(), proposal.parents.tolist()
    at = -1
    nodes = list(enumerate(zip(tokens, parents, strict=True)))
    for tok in path:  # the path is a branch of the tree
        at = next(i for i, (t, p) in nodes if p == at and t == tok)

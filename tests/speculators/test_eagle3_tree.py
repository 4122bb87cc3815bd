"""eagle3 tree drafting (greedy): structure, agreement with the chain, rollback, lossless."""

from __future__ import annotations

import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.registry import new_speculator

from .helpers import feed_from_scratch, target_features

GREEDY = SamplingParams()


def _eagle(target, **tree) -> Eagle3Speculator:
    """A random-init head: unsure of everything, so no probability floor unless asked."""
    tree.setdefault("tree_min_prob", 0.0)
    spec = new_speculator("eagle3", target, draft_vocab_size=32, **tree)
    assert isinstance(spec, Eagle3Speculator)
    return spec


def _feats(tiny, sequence):
    return target_features(tiny, sequence, _eagle(tiny).feature_layers)


def test_eagle3_tiny_random_init_tree_has_the_asked_shape(tiny, sequence) -> None:
    spec = _eagle(tiny, tree_nodes=12, tree_width=3)
    feed_from_scratch(spec, sequence[:12], 10, _feats(tiny, sequence)[:12])
    proposal = spec.propose(4, GREEDY, None)
    assert proposal.is_tree and proposal.num_tokens == 12
    depths = proposal.depths()
    assert depths == sorted(depths) and max(depths) <= 4
    assert depths.count(1) <= 3  # tree_width children of the pending token
    assert bool(spec.head.t2d[proposal.tokens].all())
    # a sampled request gets a chain
    sampled = spec.propose(4, SamplingParams(temperature=0.8), torch.Generator().manual_seed(0))
    assert not sampled.is_tree and sampled.num_tokens == 4


def test_eagle3_tiny_random_init_width_one_tree_is_the_greedy_chain(tiny, sequence) -> None:
    feats = _feats(tiny, sequence)
    chain, tree = _eagle(tiny, tree_nodes=0), _eagle(tiny, tree_nodes=5, tree_width=1)
    for spec in (chain, tree):
        feed_from_scratch(spec, sequence[:14], 10, feats[:14])
    ours, theirs = tree.propose(5, GREEDY, None), chain.propose(5, GREEDY, None)
    assert ours.tokens.tolist() == theirs.tokens.tolist()
    assert ours.parents.tolist() == [-1, 0, 1, 2, 3]


def test_eagle3_tiny_random_init_tree_rolls_back_at_commit(tiny, sequence) -> None:
    feats = _feats(tiny, sequence)
    spec, fresh = _eagle(tiny, tree_nodes=10), _eagle(tiny, tree_nodes=10)
    feed_from_scratch(spec, sequence[:12], 10, feats[:12])
    spec.propose(4, GREEDY, None)
    spec.commit(sequence[12:15], feats[11:14])
    feed_from_scratch(fresh, sequence[:15], 10, feats[:15])
    ours, theirs = spec.propose(4, GREEDY, None), fresh.propose(4, GREEDY, None)
    assert ours.tokens.tolist() == theirs.tokens.tolist()
    assert ours.parents.tolist() == theirs.parents.tolist()


def test_eagle3_tiny_random_init_tree_decoding_is_lossless(tiny) -> None:
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompt = list(range(3, 20))
    plain = SpeculativeEngine(tiny).generate(prompt, params)
    spec = _eagle(tiny, tree_nodes=16, tree_width=4)
    res = SpeculativeEngine(tiny, spec, 5).generate(prompt, params)
    assert res.token_ids == plain.token_ids
    assert res.stats.num_draft_tokens > 5 * res.stats.num_drafts  # trees, not chains


def test_eagle3_tiny_random_init_tree_min_prob_prunes_unlikely_candidates(tiny, sequence):
    feats = _feats(tiny, sequence)
    full, pruned = _eagle(tiny, tree_nodes=12), _eagle(tiny, tree_nodes=12, tree_min_prob=1.0)
    default = new_speculator("eagle3", tiny, draft_vocab_size=32)  # floor 0.05
    for spec in (full, pruned, default):
        feed_from_scratch(spec, sequence[:12], 10, feats[:12])
    whole = full.propose(4, GREEDY, None)
    assert whole.num_tokens == 12
    assert 1 <= default.propose(4, GREEDY, None).num_tokens < 12
    assert pruned.propose(4, GREEDY, None).tokens.tolist() == whole.tokens[:1].tolist()


def test_eagle3_tiny_random_init_tree_stops_drafting_when_no_deeper_candidate_can_win(
        tiny, sequence, monkeypatch):
    """Skipping the depths whose candidates could not be proposed changes no proposal."""
    from autospec.speculators.eagle3.tree import DraftTree

    feats = _feats(tiny, sequence)
    settings = [(12, 0.0), (4, 0.0), (16, 0.02), (16, 0.05), (12, 1.0)]

    def drafts(exhaustive: bool) -> list[tuple[list[int], list[int], int]]:
        if exhaustive:
            monkeypatch.setattr(DraftTree, "worth_expanding", lambda *a: True)
        out = []
        for nodes, floor in settings:
            spec = _eagle(tiny, tree_nodes=nodes, tree_width=4, tree_min_prob=floor)
            feed_from_scratch(spec, sequence[:12], 10, feats[:12])
            calls = _count_calls(spec.head, "step_tree")
            proposal = spec.propose(5, GREEDY, None)
            out.append((proposal.tokens.tolist(), proposal.parents.tolist(), len(calls)))
        monkeypatch.undo()
        return out

    early, full = drafts(False), drafts(True)
    assert [e[:2] for e in early] == [f[:2] for f in full]
    assert all(f[2] == 4 for f in full)  # k - 1 head forwards without the stop
    assert early[-1][2] == 0  # a floor of 1: only the likeliest depth-1 candidate
    assert early[1][2] < 4  # 4 nodes: the 4 children of the pending token win


def _count_calls(obj, name: str) -> list[int]:
    """Wrap ``obj.name`` so that each call appends to the returned list."""
    calls: list[int] = []
    method = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return calls

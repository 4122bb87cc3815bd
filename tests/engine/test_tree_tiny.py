"""Tree drafts on tiny random-init targets: tree attention, branch choice, KV compaction."""

import random

import pytest
import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.protocol import Proposal, Speculator
from autospec.engine.sampling import SamplingParams
from autospec.engine.verify import accept_tree, greedy_tree_verify
from tests.tiny import tiny_target

GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5], list(range(3, 40))]


class TreeOracle(Speculator):
    """Knows the target's continuation; hides its first ``n`` tokens (``n`` random per
    step) among wrong siblings in a tree, wrong branches going deeper than the right one."""

    kind = "tree-oracle"

    def __init__(self, continuation: list[int], vocab: int, width: int, seed: int) -> None:
        self.continuation, self.vocab, self.width = continuation, vocab, width
        self.rng = random.Random(seed)
        self.position = 0
        self.planted: list[int] = []  # the right branch's length of each step

    def begin(self, prompt_ids, features) -> None:
        self.position = 0

    def commit(self, tokens, features) -> None:
        self.position += int(tokens.shape[0])

    def _wrong(self, right: int) -> int:
        return self.rng.choice([t for t in range(self.vocab) if t != right])

    def propose(self, k, sampling, generator) -> Proposal:
        ahead = self.continuation[self.position : self.position + k]
        n = self.rng.randint(0, len(ahead))
        self.planted.append(n)
        tokens, parents, on_branch = [], [], -1
        for depth in range(len(ahead)):
            right = ahead[depth] if depth < n else None
            slot = self.rng.randrange(self.width)
            for j in range(self.width):
                tok = right if (j == slot and right is not None) else self._wrong(ahead[depth])
                tokens.append(tok)
                parents.append(on_branch)
                if j == slot:
                    new_branch = len(tokens) - 1
            if right is None and depth + 1 < len(ahead):  # wrong, deeper than the right end
                tokens.append(self._wrong(-1))
                parents.append(len(tokens) - 2)
            on_branch = new_branch
        return Proposal(torch.tensor(tokens, dtype=torch.long), None,
                        torch.tensor(parents, dtype=torch.long))


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=64, seed=0)


@pytest.mark.parametrize("width", [1, 3])
def test_tree_oracle_tiny_random_init_is_lossless_and_accepts_the_planted_branch(target,
                                                                                 width):
    for seed, prompt in enumerate(PROMPTS):
        plain = SpeculativeEngine(target).generate(prompt, GREEDY).token_ids
        spec = TreeOracle(plain, 64, width, seed)
        res = SpeculativeEngine(target, spec, 5).generate(prompt, GREEDY)
        assert res.token_ids == plain
        assert res.stats.num_accepted_tokens == sum(spec.planted)
        assert res.stats.num_drafts - len(spec.planted) in (0, 1)  # + a last step with k = 0
        assert len(res.stats.accepted_per_position) == 5  # per depth, not per tree node
        assert res.stats.tau > 1.5  # the planted branches are found, not just their roots


def test_a_tree_verify_leaves_the_cache_as_a_chain_would(target):
    """After a tree step the cache equals a cache that only ever saw the accepted tokens."""
    prompt = torch.tensor(PROMPTS[1])
    plain = SpeculativeEngine(target).generate(PROMPTS[1], GREEDY).token_ids
    tree = target.new_cache()
    target.forward(prompt, tree)
    # pending plain[0]; drafts: a wrong sibling, then plain[1], a wrong child, plain[2]
    drafts = torch.tensor([(plain[1] + 1) % 64, plain[1], 5, plain[2]])
    parents = torch.tensor([-1, -1, 0, 1])
    start = tree.length
    out = target.forward(torch.cat([torch.tensor(plain[:1]), drafts]), tree,
                         tree_parents=parents)
    path, nxt = greedy_tree_verify(drafts, parents, out.logits)
    assert path == [1, 3] and nxt == plain[3]
    tree.keep(start, [0, 2, 4])
    chain = target.new_cache()
    target.forward(torch.cat([prompt, torch.tensor(plain[:3])]), chain)
    for a, b in zip(tree.inner.layers, chain.inner.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)


def test_accept_tree_takes_the_deepest_agreeing_branch():
    #        pending -> 0:a -> 2:c -> 4:e
    #                -> 1:b -> 3:d
    tokens = torch.tensor([10, 11, 12, 13, 14])
    parents = torch.tensor([-1, -1, 0, 1, 2])
    # rows: 0 pending, i + 1 draft i; after pending 11 (b), after b (row 2) 13 (d)
    choice = torch.tensor([11, 12, 13, 0, 14, 0])
    assert accept_tree(tokens, parents, choice) == [1, 3]
    choice = torch.tensor([10, 12, 13, 14, 0, 0])  # a, then c (row 1), then e (row 3)
    assert accept_tree(tokens, parents, choice) == [0, 2, 4]
    assert accept_tree(tokens, parents, torch.tensor([9, 0, 0, 0, 0, 0])) == []


def test_first_branch_of_a_tree_is_the_chain_of_first_children():
    p = Proposal(torch.tensor([10, 11, 12, 13, 14]), None, torch.tensor([-1, -1, 0, 1, 2]))
    assert p.first_branch().tokens.tolist() == [10, 12, 14]
    assert p.depths() == [1, 1, 2, 2, 3]


def test_with_branch_adds_only_the_nodes_the_tree_lacks():
    tree = Proposal(torch.tensor([10, 11, 12]), None, torch.tensor([-1, -1, 0]))
    grown = tree.with_branch([10, 12, 7])  # shares 10 -> 12, adds 7 under 12
    assert grown.tokens.tolist() == [10, 11, 12, 7]
    assert grown.parents.tolist() == [-1, -1, 0, 2]
    chain = Proposal(torch.tensor([5, 6]), None).with_branch([5, 8])
    assert chain.tokens.tolist() == [5, 6, 8] and chain.parents.tolist() == [-1, 0, 0]


def test_a_tree_for_a_sampled_request_is_verified_as_its_first_branch(target):
    """Trees are greedy-only: a sampled request verifies the first branch (one-hot q)."""
    params = SamplingParams(max_new_tokens=20, temperature=0.7, seed=5, ignore_eos=True)
    plain = SpeculativeEngine(target).generate(PROMPTS[0], GREEDY).token_ids
    res = SpeculativeEngine(target, TreeOracle(plain, 64, 3, 0), 4).generate(PROMPTS[0], params)
    assert len(res.token_ids) == 20
    assert res.stats.num_draft_tokens <= 4 * res.stats.num_drafts  # chains, not trees

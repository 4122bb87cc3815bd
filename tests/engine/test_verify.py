"""Verification functions: greedy prefix rule and lossless rejection sampling."""

import torch

from autospec.engine.verify import greedy_verify, rejection_verify


def test_greedy_accepts_longest_matching_prefix_then_target_token():
    logits = torch.full((4, 10), -1.0)
    for pos, tok in enumerate([3, 5, 7, 9]):
        logits[pos, tok] = 1.0
    assert greedy_verify(torch.tensor([3, 5, 7]), logits) == (3, 9)  # all + bonus
    assert greedy_verify(torch.tensor([3, 6, 7]), logits) == (1, 5)  # recovered at 1
    assert greedy_verify(torch.tensor([0, 5, 7]), logits) == (0, 3)
    assert greedy_verify(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 3)


def _empirical_first_token(p, q, n_draws, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n_draws):
        draft = torch.multinomial(q, 1, generator=g)  # [1]
        n, nxt = rejection_verify(draft, q[None], torch.stack([p, p]), g)
        counts[int(draft[0]) if n == 1 else nxt] += 1
    return counts / n_draws


def test_rejection_sampling_reproduces_target_distribution():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.05, 0.1, 0.15, 0.2, 0.5])  # a draft that is badly wrong
    freq = _empirical_first_token(p, q, 20000)
    # 20k draws: the standard error per cell is <= 0.0036; 5 sigma bound
    assert torch.allclose(freq, p, atol=0.018), (freq, p)
    # the bound can fail: the draft's own distribution is far outside it
    assert not torch.allclose(q, p, atol=0.018)


def test_rejection_sampling_with_deterministic_proposer():
    p = torch.tensor([0.1, 0.6, 0.3])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(3)
    for _ in range(20000):
        n, nxt = rejection_verify(torch.tensor([2]), None, torch.stack([p, p]), g)
        counts[2 if n == 1 else nxt] += 1
    assert torch.allclose(counts / 20000, p, atol=0.018)


def test_all_accepted_draws_bonus_from_last_distribution():
    p = torch.zeros(3, 4)
    p[0, 1] = p[1, 2] = p[2, 3] = 1.0
    q = p[:2].clone()
    assert rejection_verify(torch.tensor([1, 2]), q, p, torch.Generator().manual_seed(0)) == (2, 3)

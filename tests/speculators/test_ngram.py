"""ngram prompt lookup: the right continuation, the latest match, longest n first."""

from __future__ import annotations

import torch

from autospec.engine.sampling import SamplingParams
from autospec.speculators.config import NgramConfig
from autospec.speculators.ngram import NgramSpeculator

GREEDY = SamplingParams()


def _spec(max_ngram: int = 3, min_ngram: int = 1) -> NgramSpeculator:
    return NgramSpeculator(NgramConfig(target_id="t", target_revision="r",
                                       max_ngram=max_ngram, min_ngram=min_ngram))


def _propose(spec: NgramSpeculator, prompt: list[int], k: int, *commits: list[int]) -> list[int]:
    spec.begin(torch.tensor(prompt), None)
    for tokens in commits:
        spec.commit(torch.tensor(tokens), None)
    proposal = spec.propose(k, GREEDY, None)
    assert proposal.probs is None
    assert proposal.tokens.dtype == torch.long
    return proposal.tokens.tolist()


def test_ngram_proposes_what_followed_the_match() -> None:
    assert _propose(_spec(), [1, 2, 3, 4, 5, 9, 9, 1, 2], 3, [3]) == [4, 5, 9]


def test_ngram_prefers_the_most_recent_occurrence() -> None:
    assert _propose(_spec(), [1, 2, 7, 1, 2, 8, 5, 1], 2, [2]) == [8, 5]


def test_ngram_prefers_the_longest_suffix() -> None:
    # "5 2" -> 6 (n=2) beats the more recent "2" -> 9 (n=1)
    assert _propose(_spec(), [5, 2, 6, 6, 2, 9, 5], 1, [2]) == [6]


def test_ngram_falls_back_to_shorter_suffix_and_caps_at_history_end() -> None:
    assert _propose(_spec(), [4, 8, 3, 8], 5) == [3, 8]


def test_ngram_no_match_is_empty() -> None:
    assert _propose(_spec(), [1, 2, 3], 4, [4]) == []
    assert _propose(_spec(min_ngram=2), [1, 2, 3, 2], 4) == []


def test_ngram_commits_extend_the_history_across_steps() -> None:
    spec = _spec()
    assert _propose(spec, [10, 11, 12], 2, [13], [10, 11]) == [12, 13]
    spec.commit(torch.tensor([12, 20]), None)
    assert spec.propose(2, GREEDY, None).tokens.tolist() == []  # "12 20" is new; "20" too


def test_ngram_begin_drops_the_previous_request() -> None:
    spec = _spec()
    _propose(spec, [1, 2, 3, 1, 2], 2)
    assert _propose(spec, [7, 8], 2) == []


def test_ngram_long_history_stays_fast() -> None:
    spec = _spec()
    gen = torch.Generator().manual_seed(0)
    spec.begin(torch.randint(0, 500, (20_000,), generator=gen), None)
    for _ in range(200):
        proposal = spec.propose(5, GREEDY, None)
        spec.commit(proposal.tokens[:2] if proposal.num_tokens else torch.tensor([1]), None)
    assert len(spec._seq) > 20_000

"""suffix: the suffix array, most-frequent continuations, the request index, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.speculators.checkpoint import SpeculatorLoadError, load_speculator, save_speculator
from autospec.speculators.config import SuffixConfig
from autospec.speculators.registry import new_speculator
from autospec.speculators.suffix import SuffixSpeculator, suffix_array, suffix_from_documents

GREEDY = SamplingParams()
DOCS = [([1, 2], [10, 11, 12, 13, 2]), ([1, 2], [10, 11, 12, 14, 2]),
        ([1, 2], [10, 11, 12, 13, 2]), ([7, 8], [20, 21, 22, 2])]


def _config(**kw) -> SuffixConfig:
    return SuffixConfig(target_id="t", target_revision="r", **kw)


@pytest.mark.parametrize("alphabet", [2, 5, 300])
def test_suffix_array_matches_naive_sort(alphabet: int) -> None:
    tokens = np.random.default_rng(alphabet).integers(-1, alphabet, 400)
    expected = sorted(range(len(tokens)), key=lambda i: tuple(tokens[i:]))
    assert suffix_array(tokens).tolist() == expected
    assert suffix_array(np.zeros(0, dtype=np.int32)).tolist() == []


def _propose(spec: SuffixSpeculator, seq: list[int], k: int = 5) -> list[int]:
    spec.begin(torch.tensor(seq), None)
    return spec.propose(k, GREEDY, None).tokens.tolist()


def test_suffix_proposes_the_most_frequent_continuation_seen_in_traffic() -> None:
    spec = suffix_from_documents(_config(), DOCS)
    assert spec.config.corpus_tokens == 3 * (2 + 5 + 1) + (2 + 4 + 1)  # tail, output, separator
    # after the prompt tail [1, 2]: 10 11 12, then 13 (2 of 3) rather than 14
    assert _propose(spec, [5, 1, 2]) == [10, 11, 12, 13, 2]
    assert _propose(spec, [9, 9, 7, 8, 20]) == [21, 22, 2]  # stops at the document's end
    assert _propose(spec, [9, 8, 30]) == []  # nothing seen: an empty proposal


def test_suffix_stops_below_min_token_prob() -> None:
    spec = suffix_from_documents(_config(min_token_prob=0.7), DOCS)
    assert _propose(spec, [1, 2, 10]) == [11, 12]  # 13 has 2/3 < 0.7


def test_suffix_uses_the_request_itself_when_traffic_has_nothing() -> None:
    spec = suffix_from_documents(_config(), DOCS)
    spec.begin(torch.tensor([40, 41, 42, 43, 50]), None)
    spec.commit(torch.tensor([40, 41]), None)
    assert spec.propose(3, GREEDY, None).tokens.tolist() == [42, 43, 50]
    spec.commit(torch.tensor([42]), None)  # rolls forward as tokens settle
    assert spec.propose(2, GREEDY, None).tokens.tolist() == [43, 50]


def test_suffix_tiny_random_init_round_trips_through_a_checkpoint(tiny, tmp_path) -> None:
    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info), DOCS)
    sha = save_speculator(spec, tmp_path / "s")
    loaded = load_speculator(tmp_path / "s", tiny)
    assert isinstance(loaded, SuffixSpeculator) and loaded.config == spec.config
    assert _propose(loaded, [5, 1, 2]) == [10, 11, 12, 13, 2]
    assert save_speculator(loaded, tmp_path / "again") == sha
    assert not list((tmp_path / "s").glob("*.pkl")) and not list((tmp_path / "s").glob("*.bin"))


def test_suffix_tiny_random_init_refuses_a_corrupt_index(tiny, tmp_path) -> None:
    import safetensors.torch

    from autospec.artifacts import write_manifest

    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info), DOCS)
    save_speculator(spec, tmp_path / "s")
    path = tmp_path / "s" / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["suffix_array"] = torch.zeros_like(tensors["suffix_array"])  # not a permutation
    safetensors.torch.save_file(tensors, str(path))
    write_manifest(tmp_path / "s", ("config.json", "model.safetensors"))  # checksums agree
    with pytest.raises(SpeculatorLoadError, match="permutation"):
        load_speculator(tmp_path / "s", tiny)


def test_suffix_tiny_random_init_is_lossless_through_the_engine(tiny) -> None:
    prompt = torch.randint(0, 63, (10,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = SpeculativeEngine(tiny).generate(prompt, SamplingParams(max_new_tokens=40))
    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info),
                                 [(prompt, plain.token_ids[:30])])
    result = SpeculativeEngine(tiny, spec, 5).generate(prompt, SamplingParams(max_new_tokens=40))
    assert result.token_ids == plain.token_ids
    assert result.stats.tau > 2.0  # the output was seen in traffic
    empty = new_speculator("suffix", tiny)
    again = SpeculativeEngine(tiny, empty, 5).generate(prompt, SamplingParams(max_new_tokens=40))
    assert again.token_ids == plain.token_ids

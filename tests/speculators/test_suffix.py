"""suffix: the suffix array, most-frequent continuations, the request index, save/load."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.speculators.checkpoint import SpeculatorLoadError, load_speculator, save_speculator
from autospec.speculators.config import SuffixConfig
from autospec.speculators.registry import new_speculator
from autospec.speculators.suffix import (
    SuffixSpeculator,
    build_corpus,
    suffix_array,
    suffix_from_documents,
)
from autospec.speculators.suffix_sort import first_unsorted

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


def test_suffix_min_path_prob_stops_where_the_product_falls_below_it() -> None:
    docs = [([1, 2], [10, 11, 12])] * 2 + [([1, 2], [10, 11, 13]), ([1, 2], [10, 14])]
    # after 1 2 10: 11 (3 of 4), then 12 (2 of 3): each above 0.1, their product 0.5
    assert _propose(suffix_from_documents(_config(), docs), [1, 2, 10]) == [11, 12]
    spec = suffix_from_documents(_config(min_path_prob=0.6), docs)
    assert _propose(spec, [1, 2, 10]) == [11]


def test_suffix_max_spec_factor_bounds_a_draft_by_the_match_it_continues() -> None:
    assert _propose(suffix_from_documents(_config(max_spec_factor=1.0), DOCS),
                    [5, 1, 2]) == [10, 11]  # the match is 1 2: two tokens
    assert _propose(suffix_from_documents(_config(max_spec_factor=2.0), DOCS),
                    [5, 1, 2]) == [10, 11, 12, 13]
    for factor, expected in ((None, [42, 43, 40, 41, 42]), (1.0, [42, 43])):
        spec = suffix_from_documents(_config(max_spec_factor=factor), DOCS)
        # the request's own n-grams: 40 41 matched (2 tokens), 43 40 41 never seen
        assert _propose(spec, [40, 41, 42, 43, 40, 41]) == expected


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
    assert (loaded.config.min_path_prob, loaded.config.max_spec_factor) == (0.1, 1.0)
    assert _propose(loaded, [5, 1, 2]) == [10, 11]  # a new version's rules: 2 tokens matched
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


def test_suffix_tiny_random_init_refuses_an_unsorted_index(tiny, tmp_path) -> None:
    """A trial's find: a suffix array that is a permutation but not sorted was loaded, and
    the version then drafted wrong tokens (its searches assume the order)."""
    import safetensors.torch

    from autospec.artifacts import write_manifest

    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info), DOCS)
    save_speculator(spec, tmp_path / "s")
    path = tmp_path / "s" / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["suffix_array"] = tensors["suffix_array"].flip(0)  # every position, reversed
    safetensors.torch.save_file(tensors, str(path))
    write_manifest(tmp_path / "s", ("config.json", "model.safetensors"))  # checksums agree
    with pytest.raises(SpeculatorLoadError, match=r"suffix_array is not sorted: the suffix "
                                                  r"at corpus position \d+ comes before"):
        load_speculator(tmp_path / "s", tiny)


def test_a_suffix_index_not_yet_filled_saves_and_loads_tiny(tiny, tmp_path) -> None:
    """An index of N tokens before its corpus is loaded (an eagle3 head's, made with
    suffix_tokens) holds N zeros and their suffix array; the array was positions 0..N-1,
    which the sortedness check (9f57572) refused on load: a fresh head with an index could
    no longer be saved and loaded (a vLLM serving test's artifact failed so)."""
    spec = SuffixSpeculator(SuffixConfig.for_target(tiny.info).model_copy(
        update={"corpus_tokens": 8}))
    assert first_unsorted(spec._tokens, spec._sa) is None
    save_speculator(spec, tmp_path / "s")
    assert load_speculator(tmp_path / "s", tiny).corpus_tokens == 8


@pytest.mark.parametrize("seed", range(6))
def test_the_sortedness_check_takes_exactly_the_suffix_array(seed: int) -> None:
    """On corpora of few distinct tokens (long repeats) with separators: the array
    suffix_array builds passes, as the brute-force sort gives it; any two entries swapped
    fail (the check is exact: one permutation is the suffix array)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(-1, 3, size=int(rng.integers(2, 60))).astype(np.int32)
    sa = suffix_array(tokens)
    brute = sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())
    assert sa.tolist() == brute and first_unsorted(tokens, sa) is None
    for _ in range(20):
        i, j = sorted(rng.choice(len(tokens), size=2, replace=False).tolist())
        swapped = sa.copy()
        swapped[[i, j]] = swapped[[j, i]]
        assert first_unsorted(tokens, swapped) is not None, (tokens, i, j)
    shuffled = rng.permutation(sa)
    assert (first_unsorted(tokens, shuffled) is None) == (shuffled == sa).all()
    assert first_unsorted(tokens[:1], sa[:0]) is None


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


# -- the optimised search proposes exactly what the plain search did -----------------------
class _Reference:
    """The suffix speculator's proposal logic before its per-step optimisation (commit
    053815b, ``git show 053815b:autospec/speculators/suffix.py``): every proposal searches
    the longest match afresh (binary search over its length, each a binary search over
    the suffix array) and counts the next tokens with ``np.unique``. Slow; the oracle."""

    def __init__(self, config: SuffixConfig, tokens: np.ndarray, sa: np.ndarray) -> None:
        self.config = config
        self._padded = np.concatenate([tokens, [-1]]).astype(np.int32)
        self._sa = sa.astype(np.int64)
        self._seq: list[int] = []
        self._local: dict[tuple[int, ...], Counter[int]] = {}

    def begin(self, prompt: list[int]) -> None:
        self._seq, self._local = [], {}
        self._extend(prompt)

    def propose(self, k: int) -> list[int]:
        if k <= 0 or not self._seq:
            return []
        best = max((self._global_path(k), self._local_path(k)), key=_expected_accepted)
        return [t for t, _ in best]

    def _global_path(self, k: int) -> list[tuple[int, float]]:
        lo, hi, depth = self._longest_match(self._seq[-self.config.max_match :])
        path: list[tuple[int, float]] = []
        while depth and len(path) < k and hi > lo:
            nxt = self._padded[self._sa[lo:hi] + depth]
            values, starts, counts = np.unique(nxt, return_index=True, return_counts=True)
            usable = values != -1
            if not usable.any():
                break
            j = int(np.argmax(np.where(usable, counts, -1)))
            prob = counts[j] / (hi - lo)
            if prob < self.config.min_token_prob:
                break
            path.append((int(values[j]), float(prob)))
            lo, hi, depth = lo + int(starts[j]), lo + int(starts[j]) + int(counts[j]), depth + 1
        return path

    def _longest_match(self, context: list[int]) -> tuple[int, int, int]:
        best = (0, 0, 0)
        low, high = 1, len(context)
        while low <= high:
            m = (low + high) // 2
            lo, hi = self._range(context[-m:])
            if hi > lo:
                best, low = (lo, hi, m), m + 1
            else:
                high = m - 1
        return best

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        pat = np.asarray(pattern, dtype=np.int32)
        m, sa, toks = len(pat), self._sa, self._padded
        n = len(sa)

        def prefix(i: int) -> np.ndarray:
            start = sa[i]
            return toks[start : min(start + m, len(toks))]

        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if _less(prefix(mid), pat):
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, n
        while lo < hi:
            mid = (lo + hi) // 2
            p = prefix(mid)
            if len(p) == m and np.array_equal(p, pat):
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def _extend(self, tokens: list[int]) -> None:
        seq, local, top = self._seq, self._local, self.config.max_local_ngram
        for token in tokens:
            i = len(seq)
            for n in range(1, min(top, i) + 1):
                local.setdefault(tuple(seq[i - n : i]), Counter())[token] += 1
            seq.append(token)

    def _local_path(self, k: int) -> list[tuple[int, float]]:
        context = self._seq[-self.config.max_local_ngram :]
        path: list[tuple[int, float]] = []
        while len(path) < k:
            counter = next((self._local[key] for n in range(len(context), 0, -1)
                            if (key := tuple(context[-n:])) in self._local), None)
            if counter is None:
                break
            token, count = counter.most_common(1)[0]
            prob = count / sum(counter.values())
            if prob < self.config.min_token_prob:
                break
            path.append((token, prob))
            context = [*context[1:], token] if len(context) == self.config.max_local_ngram \
                else [*context, token]
        return path


def _less(a: np.ndarray, b: np.ndarray) -> bool:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    if len(diff):
        return bool(a[diff[0]] < b[diff[0]])
    return len(a) < len(b)


def _expected_accepted(path: list[tuple[int, float]]) -> float:
    total, running = 0.0, 1.0
    for _, prob in path:
        running *= prob
        total += running
    return total


def _markov(rng: np.random.Generator, vocab: int, length: int, loops: bool) -> list[int]:
    """A sequence from a sparse random chain (a few likely successors per token); with
    ``loops``, it may fall into repeating a short phrase, as small models do."""
    successors = np.random.default_rng(vocab).integers(0, vocab, (vocab, 4))
    seq = [int(rng.integers(vocab))]
    for _ in range(length - 1):
        seq.append(int(successors[seq[-1], rng.choice(4, p=[0.55, 0.25, 0.15, 0.05])]))
    if loops and length > 6 and rng.random() < 0.5:
        at, period = int(rng.integers(6, length)), int(rng.integers(1, 6))
        seq = seq[:at] + (seq[max(0, at - period) : at] * length)[: length - at]
    return seq


def _request(rng: np.random.Generator, docs: list[list[int]], vocab: int) -> list[int]:
    """A request stitched from spans of the corpus documents, with random tokens between
    (so matches grow, reach ``max_match``, break and restart)."""
    seq: list[int] = []
    while len(seq) < 120:
        if rng.random() < 0.75:
            doc = docs[int(rng.integers(len(docs)))]
            start = int(rng.integers(len(doc)))
            seq += doc[start : start + int(rng.integers(1, 60))]
        else:
            seq += rng.integers(0, vocab + 2, int(rng.integers(1, 4))).tolist()
    return seq


@pytest.mark.parametrize(("corpus", "memo"), [
    *[(corpus, memo) for corpus in ("random-2", "markov-40", "loops-300")
      for memo in ("default", "python-only", "numpy-only")],
    ("random-5", "default"), ("empty", "default")])
def test_suffix_proposes_what_the_plain_search_proposed(corpus: str, memo: str,
                                                        monkeypatch) -> None:
    import autospec.speculators.suffix as suffix

    if memo != "default":  # every range counted by one method, and the memo kept tiny
        monkeypatch.setattr(suffix, "_NUMPY_RANGE", 10**9 if memo == "python-only" else 1)
        monkeypatch.setattr(suffix, "_MEMO_LIMIT", 8)
    kind, _, size = corpus.partition("-")
    vocab = int(size or 10)
    rng = np.random.default_rng(len(corpus) * 31 + len(memo))
    if kind == "random":
        docs = [rng.integers(0, vocab, int(rng.integers(1, 40))).tolist() for _ in range(60)]
    else:
        docs = [_markov(rng, vocab, int(rng.integers(5, 80)), kind == "loops")
                for _ in range(0 if kind == "empty" else 80)]
    configs = [_config(), _config(max_match=3, max_local_ngram=1, min_token_prob=0.0),
               _config(max_match=1, prompt_tail=0, min_token_prob=0.4),
               _config(max_match=12, max_local_ngram=2, prompt_tail=2, min_token_prob=0.25)]
    steps = 0
    for config in configs:
        documents = [(doc[:4], doc[4:]) for doc in docs]
        spec = suffix_from_documents(config, documents)
        tokens = build_corpus(documents, config.prompt_tail)
        assert spec.state_tensors()["tokens"].tolist() == tokens.tolist()
        ref = _Reference(config, tokens, suffix_array(tokens))
        for _ in range(4):  # several requests on one speculator: begin drops the last one
            seq = _request(rng, docs or [[1, 2, 3]], vocab)
            cut = int(rng.integers(0, 12))
            spec.begin(torch.tensor(seq[:cut], dtype=torch.long), None)
            ref.begin(seq[:cut])
            while cut < len(seq):
                k = int(rng.integers(0, 8))
                got = spec.propose(k, GREEDY, None).tokens.tolist()
                assert got == ref.propose(k), (config, seq[:cut], k)
                assert spec._global_path(k) == ref._global_path(k)
                assert spec._local_path(k) == ref._local_path(k)
                m = int(rng.integers(1, 4))
                spec.commit(torch.tensor(seq[cut : cut + m], dtype=torch.long), None)
                ref._extend(seq[cut : cut + m])
                cut, steps = cut + m, steps + 1
    assert steps > 600


def test_suffix_keeps_proposing_the_same_after_a_new_corpus_mid_request() -> None:
    spec = suffix_from_documents(_config(), DOCS)
    spec.begin(torch.tensor([5, 1, 2]), None)
    assert spec.propose(5, GREEDY, None).tokens.tolist() == [10, 11, 12, 13, 2]
    other = build_corpus([([1, 2], [10, 11, 30, 31])], 4)
    spec.set_corpus(other, suffix_array(other))  # the match found before no longer holds
    assert spec.propose(5, GREEDY, None).tokens.tolist() == [10, 11, 30, 31]
    spec.commit(torch.tensor([10, 11]), None)
    assert spec.propose(5, GREEDY, None).tokens.tolist() == [30, 31]


def test_suffix_a_version_written_before_the_rules_drafts_as_it_was_evaluated(
        tiny, tmp_path) -> None:
    import json

    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info), DOCS)
    save_speculator(spec, tmp_path / "s")
    config = tmp_path / "s" / "config.json"
    data = json.loads(config.read_text())
    del data["min_path_prob"], data["max_spec_factor"]  # as an older autospec wrote it
    config.write_text(json.dumps(data))
    from autospec.artifacts import write_manifest

    write_manifest(tmp_path / "s", ("config.json", "model.safetensors"))
    old = load_speculator(tmp_path / "s", tiny)
    assert (old.config.min_path_prob, old.config.max_spec_factor) == (0.0, None)
    assert _propose(old, [5, 1, 2]) == [10, 11, 12, 13, 2]

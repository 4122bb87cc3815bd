"""``suffix``: propose the most frequent continuation seen in past traffic (SuffixDecoding).

Two indexes, searched at every step with the sequence's latest tokens:

- a **global index** over past outputs: the token arrays of the window's outputs (each
  preceded by the last ``prompt_tail`` prompt tokens, so the first output tokens have a
  context; documents separated by ``-1``) and their **suffix array**, both int32
  tensors stored in ``model.safetensors``. Built by :func:`build_suffix_index`
  ("retraining" takes seconds, :func:`suffix_from_documents`), never by gradient;
- a **request index** over the current request (prompt + output so far): every n-gram
  (``n <= max_local_ngram``) counts the tokens that followed it, updated as tokens commit.

**Global proposal.** Find the longest suffix of the sequence (up to ``max_match``
tokens) that occurs in the corpus: the occurrences are one contiguous range of the
suffix array (binary search). Their next tokens are sorted inside that range, so the
most frequent one and its sub-range are found with two more searches; its estimated
probability is its share of the range. Append it and repeat in the sub-range: this
walks the most frequent path of the suffix tree, as SuffixDecoding does.
**Request proposal.** The same walk over the request index, longest n-gram first.

Each proposal stops at ``k`` tokens or when a token's estimated probability falls below
``min_token_prob`` — and, as SuffixDecoding stops (new versions: ``NEW_SUFFIX_RULES``; a
version written before them has neither), when the product of the probabilities so far falls
below ``min_path_prob`` or at ``max_spec_factor`` tokens per token of the match it continues
—; the one with the larger expected accepted length
(sum of cumulative products of the probabilities) wins. Proposals are deterministic
(``probs`` is ``None``): under sampling the verifier treats them as one-hot drafts.

**Cost per step** (a few tens of microseconds on a 50k-token corpus). The longest match
is kept across commits: a committed token narrows its range to the suffixes whose next
token is that token (two bisections, the next tokens being sorted inside the range). Only
when it cannot grow (a mismatch, or ``max_match`` reached) is the longest match searched
again, lazily at the next proposal, knowing it is at most as long as the last one plus the
tokens committed since. The most frequent next token of a range is memoised per range.
Searches compare Python ints and byte slices (the corpus as big-endian ``token + 1``
words, whose byte order is the token order) through :mod:`bisect`, not numpy calls.

Trained by :func:`fit_suffix` (the window's documents indexed); vLLM serves it as autospec's
custom proposer (:func:`export_suffix`), seeded with the version's index.
"""

from __future__ import annotations

import copy
import json
import logging
import struct
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.speculators.common import (
    SavableSpeculator,
    longest_match,
    match_length,
    ngrams_ending,
)
from autospec.speculators.config import SuffixConfig
from autospec.speculators.files import WEIGHTS_FILE, save_tensors, tensor_sha256
from autospec.speculators.kind import Exported, FitTraining, Kind, VllmSupport
from autospec.speculators.suffix_sort import first_unsorted, suffix_array

log = logging.getLogger(__name__)

SEPARATOR = -1
#: ranges at least this wide find their most frequent next token with numpy, smaller in Python
_NUMPY_RANGE = 64
#: memoised ranges kept before the memo starts afresh
_MEMO_LIMIT = 1 << 16


def build_corpus(documents: Iterable[tuple[Sequence[int], Sequence[int]]],
                 prompt_tail: int) -> np.ndarray:
    """``int32 [N]``: each (prompt, output) as the prompt's tail + output, then ``-1``."""
    parts: list[int] = []
    for prompt, output in documents:
        if not output:
            continue
        tail = list(prompt[-prompt_tail:]) if prompt_tail else []
        parts += [*tail, *output, SEPARATOR]
    return np.asarray(parts, dtype=np.int32)


class SuffixSpeculator(SavableSpeculator):
    """Most-frequent-continuation speculator; see the module docstring."""

    kind = "suffix"

    def __init__(self, config: SuffixConfig, target: Target | None = None) -> None:
        self.config = config
        self.set_corpus(np.zeros(config.corpus_tokens, dtype=np.int32),  # until loaded:
                        np.arange(config.corpus_tokens - 1, -1, -1, dtype=np.int64))  # sorted
        self._seq: list[int] = []
        self._local: dict[tuple[int, ...], Counter[int]] = {}

    def set_corpus(self, tokens: np.ndarray, sa: np.ndarray) -> None:
        """Use ``tokens`` (``int32 [N]``) and their suffix array (``[N]``) as the global index."""
        assert tokens.shape == sa.shape, "tokens and suffix array must both be [N]"
        self._tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        # one sentinel past the end: a suffix running off the corpus reads a separator
        self._padded = np.concatenate([self._tokens, [SEPARATOR]]).astype(np.int32)
        self._sa = np.ascontiguousarray(sa, dtype=np.int64)
        # views for the search: element access gives Python ints, slices compare in C
        self._tok_at = memoryview(self._padded)  # [N + 1] token at a corpus position
        self._sa_at = memoryview(self._sa)  # [N] suffix array entry
        # big-endian (token + 1) words: byte order of a slice == token order, -1 first
        self._tok_bytes = (self._padded.astype(np.int64) + 1).astype(">u4").tobytes()
        first = self._padded[self._sa]  # [N] first token of each suffix, sorted
        starts, counts = _runs(first)
        ranges = zip(starts.tolist(), (starts + counts).tolist(), strict=True)
        self._first = dict(zip(first[starts].tolist(), ranges, strict=True))  # token -> range
        self._memo: dict[tuple[int, int, int], tuple[int, int, int] | None] = {}
        self._stale(self.config.max_match)

    @property
    def corpus_tokens(self) -> int:
        return int(self._tokens.shape[0])

    def corpus_prefix(self, n: int) -> np.ndarray:
        """A copy of the first ``n`` corpus tokens (whole documents when ``n`` ends one)."""
        if not 0 <= n <= self.corpus_tokens:
            raise ValueError(f"n must be in [0, {self.corpus_tokens}], got {n}")
        return self._tokens[:n].copy()

    # -- protocol -------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        assert prompt_ids.dim() == 1, f"prompt_ids must be [n], got {tuple(prompt_ids.shape)}"
        self._seq, self._local = [], {}
        self._stale(0)  # the empty sequence matches nothing; each token adds at most one
        self._extend(prompt_ids.tolist())

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        assert tokens.dim() == 1, f"tokens must be [m], got {tuple(tokens.shape)}"
        self._extend(tokens.tolist())

    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        best = self.best_path(k)
        if not best:
            return Proposal.empty()
        return Proposal(tokens=torch.tensor([t for t, _ in best], dtype=torch.long), probs=None)

    def fork(self) -> SuffixSpeculator:
        """A speculator for another request over the same global index (shared, read-only;
        its memo shared too), with an empty sequence: :meth:`extend` it with the tokens."""
        twin = copy.copy(self)
        twin._seq, twin._local = [], {}
        twin._stale(0)
        return twin

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the sequence (as :meth:`begin` and :meth:`commit` do)."""
        self._extend(tokens)

    def draft(self, k: int) -> list[int]:
        """The proposal's tokens (up to ``k``), as :meth:`propose` returns them."""
        return [token for token, _ in self.best_path(k)]

    def best_path(self, k: int) -> list[tuple[int, float]]:
        """The proposal (up to ``k`` tokens), each token with its estimated probability."""
        if k <= 0 or not self._seq:
            return []
        return max((self._global_path(k), self._local_path(k)), key=expected_accepted)

    def _extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._extend_local(token)
            self._advance_match(token)

    # -- global index ---------------------------------------------------------------------
    def _global_path(self, k: int) -> list[tuple[int, float]]:
        """Most frequent continuation in the corpus of the longest matching suffix."""
        lo, hi, depth = self._longest_match()
        k = self._draft_limit(k, depth)
        path: list[tuple[int, float]] = []
        while depth and len(path) < k:
            child = self._most_frequent_next(lo, hi, depth)
            if child is None:  # only separators follow
                break
            token, start, count = child
            if not self._takes(path, prob := count / (hi - lo)):
                break
            path.append((token, prob))
            lo, hi, depth = start, start + count, depth + 1
        return path

    def _draft_limit(self, k: int, match: int) -> int:
        """At most ``k`` tokens, and ``max_spec_factor`` per token of the ``match``."""
        factor = self.config.max_spec_factor
        return k if factor is None else min(k, int(match * factor + 1e-6))

    def _takes(self, path: list[tuple[int, float]], prob: float) -> bool:
        """Whether a token of estimated probability ``prob`` extends ``path``: ``prob`` at
        least ``min_token_prob``, and the path's product at least ``min_path_prob``."""
        if prob < self.config.min_token_prob:
            return False
        if self.config.min_path_prob <= 0.0:
            return True
        running = prob
        for _, p in path:
            running *= p
        return running >= self.config.min_path_prob

    def _stale(self, bound: int) -> None:
        """Forget the match; the longest one is at most ``bound`` tokens long."""
        self._match: tuple[int, int, int] | None = None
        self._bound = bound

    def _advance_match(self, token: int) -> None:
        """Update the longest match for ``token`` appended to the sequence."""
        if self._match is None:
            self._bound = min(self._bound + 1, self.config.max_match)
            return
        lo, hi, depth = self._match
        if depth < self.config.max_match:
            narrowed = self._narrow(lo, hi, depth, token)
            if narrowed is not None:  # the match grew by one: still the longest
                self._match = (*narrowed, depth + 1)
                return
        # a mismatch (or max_match reached): the new longest match is at most ``depth`` long
        self._stale(depth)

    def _longest_match(self) -> tuple[int, int, int]:
        """Suffix-array range and length of the longest suffix of the sequence in the
        corpus (at most ``max_match`` tokens); the whole array and 0 when none occurs."""
        if self._match is None:
            seq = self._seq
            best, high = (0, self.corpus_tokens, 0), min(self._bound, len(seq))
            found = self._range(seq[-high:]) if high else None
            if found is not None:  # the bound itself: the usual case once max_match is hit
                best = (*found, high)
            else:  # occurrence is monotone in the suffix length: binary search it
                low, high = 1, high - 1
                while low <= high:
                    m = (low + high) // 2
                    found = self._range(seq[-m:])
                    if found is not None:
                        best, low = (*found, m), m + 1
                    else:
                        high = m - 1
            self._match = best
        return self._match

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int] | None:
        """The part of ``[lo, hi)`` (suffixes sharing ``depth`` tokens) whose next token is
        ``token``, or ``None``; the next tokens are sorted inside the range."""
        if depth == 0:
            return self._first.get(token)
        tok = self._tok_at

        def next_token(start: int) -> int:
            return tok[start + depth]

        first = bisect_left(self._sa_at, token, lo, hi, key=next_token)
        last = bisect_right(self._sa_at, token, first, hi, key=next_token)
        return (first, last) if last > first else None

    def _range(self, pattern: list[int]) -> tuple[int, int] | None:
        """``[lo, hi)``: the suffixes that start with ``pattern`` (non-empty), or ``None``."""
        found = self._first.get(pattern[0])
        if found is None or len(pattern) == 1:
            return found
        rest = struct.pack(f">{len(pattern) - 1}I", *[t + 1 for t in pattern[1:]])
        data, width = self._tok_bytes, len(rest)

        def after_first(start: int) -> bytes:  # truncated at the corpus end, as ``rest`` sorts
            return data[4 * start + 4 : 4 * start + 4 + width]

        first = bisect_left(self._sa_at, rest, found[0], found[1], key=after_first)
        last = bisect_right(self._sa_at, rest, first, found[1], key=after_first)
        return (first, last) if last > first else None

    def _most_frequent_next(self, lo: int, hi: int, depth: int) -> tuple[int, int, int] | None:
        """(token, start, count): the most frequent token (the smallest on a tie) after the
        ``depth`` shared tokens of ``[lo, hi)`` and its sub-range; ``None`` if only
        separators follow. Memoised per range."""
        key = (lo, hi, depth)
        if key in self._memo:
            return self._memo[key]
        if hi - lo >= _NUMPY_RANGE:
            nxt = self._padded[self._sa[lo:hi] + depth]  # sorted: same prefix, then next token
            starts, counts = _runs(nxt)
            counts[nxt[starts] == SEPARATOR] = 0
            j = int(np.argmax(counts))  # the first maximum: the smallest token
            child = (int(nxt[starts[j]]), lo + int(starts[j]), int(counts[j])) \
                if counts[j] else None
        else:
            tok, child, best = self._tok_at, None, 0
            nxt = [tok[start + depth] for start in self._sa_at[lo:hi]]
            run = 0
            for i in range(1, len(nxt) + 1):
                if i == len(nxt) or nxt[i] != nxt[run]:
                    if i - run > best and nxt[run] != SEPARATOR:
                        child, best = (nxt[run], lo + run, i - run), i - run
                    run = i
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = child
        return child

    # -- request index --------------------------------------------------------------------
    def _extend_local(self, token: int) -> None:
        seq, local = self._seq, self._local
        for key in ngrams_ending(seq, range(1, self.config.max_local_ngram + 1)):
            counter = local.get(key)
            if counter is None:
                counter = local[key] = Counter()
            counter[token] += 1
        seq.append(token)

    def _local_path(self, k: int) -> list[tuple[int, float]]:
        """Most frequent continuation in this request of its longest matching n-gram."""
        context = self._seq[-self.config.max_local_ngram :]
        path: list[tuple[int, float]] = []
        if self.config.max_spec_factor is not None:  # the longest n-gram matched bounds it
            k = self._draft_limit(k, match_length(self._local, context,
                                                  range(1, len(context) + 1)))
        while len(path) < k:
            counter = longest_match(self._local, context, range(1, len(context) + 1))
            if counter is None:
                break
            token, count = counter.most_common(1)[0]
            prob = count / sum(counter.values())
            if not self._takes(path, prob):
                break
            path.append((token, prob))
            context = [*context[1:], token] if len(context) == self.config.max_local_ngram \
                else [*context, token]
        return path

    # -- weights --------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The corpus and its suffix array (``int32 [N]`` each)."""
        return {"tokens": torch.from_numpy(self._tokens.copy()),
                "suffix_array": torch.from_numpy(self._sa.astype(np.int32))}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        tokens = tensors["tokens"].numpy().astype(np.int32)
        sa = tensors["suffix_array"].numpy().astype(np.int64)
        n = len(tokens)
        if len(sa) != n or (n and (sa.min() < 0 or sa.max() >= n or
                                   len(np.unique(sa)) != n)):
            raise ValueError("suffix_array is not a permutation of the corpus positions")
        if (unsorted := first_unsorted(tokens, sa)) is not None:
            raise ValueError(f"suffix_array is not sorted: the suffix at corpus position "
                             f"{sa[unsorted]} comes before the one at {sa[unsorted + 1]}, "
                             f"which is smaller (its proposals would be wrong)")
        self.set_corpus(tokens, sa)


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index and length of each run of equal values in ``values`` (``[n]``)."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return starts, np.diff(np.append(starts, len(values)))


def expected_accepted(path: list[tuple[int, float]]) -> float:
    """Sum over positions of the product of the probabilities so far."""
    total, running = 0.0, 1.0
    for _, prob in path:
        running *= prob
        total += running
    return total


def suffix_from_documents(config: SuffixConfig,
                          documents: Iterable[tuple[Sequence[int], Sequence[int]]],
                          target: Target | None = None,
                          carried: np.ndarray | None = None) -> SuffixSpeculator:
    """A suffix speculator indexing ``documents`` (after ``carried``, a corpus of earlier
    documents as :meth:`SuffixSpeculator.corpus_prefix` gives it), with ``corpus_tokens``
    set to fit."""
    tokens = build_corpus(documents, config.prompt_tail)
    if carried is not None and len(carried):
        tokens = np.concatenate([np.asarray(carried, dtype=np.int32), tokens])
    spec = SuffixSpeculator(config.model_copy(update={"corpus_tokens": len(tokens)}), target)
    spec.set_corpus(tokens, suffix_array(tokens))
    return spec


def fit_suffix(config: SuffixConfig, documents: Iterable[tuple[Sequence[int], Sequence[int]]],
               target: Target) -> tuple[SuffixSpeculator, dict[str, int]]:
    """Training: index the window's documents (seconds, no gradient)."""
    spec = suffix_from_documents(config, documents, target)
    return spec, {"corpus_tokens": spec.corpus_tokens}


#: vLLM runs this class (``method: custom_class``) over the exported index
#: (:mod:`autospec.interop.vllm_proposer`), reading it from the directory this variable names
VLLM_PROPOSER = "autospec.interop.vllm_proposer.SuffixIndexProposer"
VLLM_INDEX_ENV = "AUTOSPEC_VLLM_SUFFIX_INDEX"


def export_suffix(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    """The version's config and index (``config.json``, ``model.safetensors``: corpus and
    suffix array) for vLLM's ``custom_class`` method with autospec's proposer."""
    (out / "config.json").write_text(
        json.dumps(spec.config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    tensors = {n: t.contiguous() for n, t in spec.state_tensors().items()}
    save_tensors(tensors, out / WEIGHTS_FILE)
    sums = {n: {"sha256": tensor_sha256(t), "from": n} for n, t in tensors.items()}
    return Exported(
        speculative_config={"method": "custom_class", "model": VLLM_PROPOSER,
                            "num_speculative_tokens": k},
        files=["config.json", WEIGHTS_FILE], tensors=sums,
        notes=[f"vLLM runs autospec's suffix proposer ({VLLM_PROPOSER}, method custom_class) "
               f"over this {spec.config.corpus_tokens}-token traffic index; autospec serve "
               f"loads it into the running engine, `vllm serve` reads it from the directory "
               f"named by {VLLM_INDEX_ENV} (autospec must be installed beside vLLM)"])


def stored_shapes(config: SuffixConfig) -> dict[str, tuple[int, ...]]:
    """The index's arrays, ``corpus_tokens`` long (allocated from it when built)."""
    return {"tokens": (config.corpus_tokens,), "suffix_array": (config.corpus_tokens,)}


KIND = Kind(name="suffix", config=SuffixConfig, speculator=SuffixSpeculator,
            training=FitTraining(fit_suffix), shapes=stored_shapes,
            vllm=VllmSupport(method="custom_class", export=export_suffix,
                             seeded_with_index=True, per_request_versions=True))

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
``min_token_prob``; the one with the larger expected accepted length
(sum of cumulative products of the probabilities) wins. Proposals are deterministic
(``probs`` is ``None``): under sampling the verifier treats them as one-hot drafts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.speculators.base import Proposal
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import SuffixConfig

log = logging.getLogger(__name__)

SEPARATOR = -1


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array of ``tokens`` (int, ``[N]``) by prefix doubling: ``int64 [N]``."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64) + 1  # >= 1
    sa = np.argsort(rank, kind="stable")
    width = 1
    while True:
        second = np.zeros(n, dtype=np.int64)  # 0: past the end, sorts first
        second[: n - width] = rank[width:]
        sa = np.lexsort((second, rank))
        r, s = rank[sa], second[sa]
        new_rank = np.empty(n, dtype=np.int64)
        new_rank[sa] = np.concatenate(([1], 1 + np.cumsum((r[1:] != r[:-1]) | (s[1:] != s[:-1]))))
        rank = new_rank
        if rank.max() == n or width >= n:
            return sa
        width *= 2


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
        self.set_corpus(np.zeros(config.corpus_tokens, dtype=np.int32),
                        np.arange(config.corpus_tokens, dtype=np.int64))
        self._seq: list[int] = []
        self._local: dict[tuple[int, ...], Counter[int]] = {}

    def set_corpus(self, tokens: np.ndarray, sa: np.ndarray) -> None:
        """Use ``tokens`` (``int32 [N]``) and their suffix array (``[N]``) as the global index."""
        assert tokens.shape == sa.shape, "tokens and suffix array must both be [N]"
        self._tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        # one sentinel past the end: a suffix running off the corpus reads a separator
        self._padded = np.concatenate([self._tokens, [SEPARATOR]]).astype(np.int32)
        self._sa = np.ascontiguousarray(sa, dtype=np.int64)

    @property
    def corpus_tokens(self) -> int:
        return int(self._tokens.shape[0])

    # -- protocol -------------------------------------------------------------------------
    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        assert prompt_ids.dim() == 1, f"prompt_ids must be [n], got {tuple(prompt_ids.shape)}"
        self._seq, self._local = [], {}
        self._extend(prompt_ids.tolist())

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        assert tokens.dim() == 1, f"tokens must be [m], got {tuple(tokens.shape)}"
        self._extend(tokens.tolist())

    def propose(
        self, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        if k <= 0 or not self._seq:
            return Proposal.empty()
        best = max((self._global_path(k), self._local_path(k)), key=_expected_accepted)
        if not best:
            return Proposal.empty()
        return Proposal(tokens=torch.tensor([t for t, _ in best], dtype=torch.long), probs=None)

    # -- global index ---------------------------------------------------------------------
    def _global_path(self, k: int) -> list[tuple[int, float]]:
        """Most frequent continuation in the corpus of the longest matching suffix."""
        lo, hi, depth = self._longest_match(self._seq[-self.config.max_match :])
        path: list[tuple[int, float]] = []
        while depth and len(path) < k and hi > lo:
            nxt = self._padded[self._sa[lo:hi] + depth]  # sorted: same prefix, then next token
            values, starts, counts = np.unique(nxt, return_index=True, return_counts=True)
            usable = values != SEPARATOR
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
        """Suffix-array range and length of the longest suffix of ``context`` in the corpus."""
        best = (0, 0, 0)
        low, high = 1, len(context)
        while low <= high:  # occurrence is monotone in the suffix length: binary search it
            m = (low + high) // 2
            lo, hi = self._range(context[-m:])
            if hi > lo:
                best, low = (lo, hi, m), m + 1
            else:
                high = m - 1
        return best

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        """``[lo, hi)``: the suffixes that start with ``pattern``."""
        pat = np.asarray(pattern, dtype=np.int32)
        m, sa, toks = len(pat), self._sa, self._padded
        n = len(sa)

        def prefix(i: int) -> np.ndarray:
            start = sa[i]
            return toks[start : min(start + m, len(toks))]

        lo, hi = 0, n
        while lo < hi:  # first suffix >= pattern
            mid = (lo + hi) // 2
            if _less(prefix(mid), pat):
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, n
        while lo < hi:  # first suffix that does not start with pattern
            mid = (lo + hi) // 2
            p = prefix(mid)
            if len(p) == m and np.array_equal(p, pat):
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    # -- request index --------------------------------------------------------------------
    def _extend(self, tokens: list[int]) -> None:
        seq, local, top = self._seq, self._local, self.config.max_local_ngram
        for token in tokens:
            i = len(seq)
            for n in range(1, min(top, i) + 1):
                local.setdefault(tuple(seq[i - n : i]), Counter())[token] += 1
            seq.append(token)

    def _local_path(self, k: int) -> list[tuple[int, float]]:
        """Most frequent continuation in this request of its longest matching n-gram."""
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
        self.set_corpus(tokens, sa)


def _less(a: np.ndarray, b: np.ndarray) -> bool:
    """Lexicographic ``a < b`` of two int arrays (a shorter prefix sorts first)."""
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    if len(diff):
        return bool(a[diff[0]] < b[diff[0]])
    return len(a) < len(b)


def _expected_accepted(path: list[tuple[int, float]]) -> float:
    """Sum over positions of the product of the probabilities so far."""
    total, running = 0.0, 1.0
    for _, prob in path:
        running *= prob
        total += running
    return total


def suffix_from_documents(config: SuffixConfig,
                          documents: Iterable[tuple[Sequence[int], Sequence[int]]],
                          target: Target | None = None) -> SuffixSpeculator:
    """A suffix speculator indexing ``documents``, with ``corpus_tokens`` set to fit."""
    tokens = build_corpus(documents, config.prompt_tail)
    spec = SuffixSpeculator(config.model_copy(update={"corpus_tokens": len(tokens)}), target)
    spec.set_corpus(tokens, suffix_array(tokens))
    return spec

"""The suffix index's array: :func:`suffix_array` sorts a corpus's suffixes (prefix
doubling, numpy), :func:`first_unsorted` checks a stored one in O(N) (a version's artifact
whose array is not sorted would propose wrong drafts: :mod:`autospec.speculators.suffix`
refuses it on load). No torch here."""

from __future__ import annotations

import numpy as np


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


def first_unsorted(tokens: np.ndarray, sa: np.ndarray) -> int | None:
    """The first ``i`` where the suffix at ``sa[i]`` is not smaller than the one at
    ``sa[i + 1]`` (None: ``sa``, a permutation, is the suffix array of ``tokens``). O(N)
    and vectorised: with ``rank`` the inverse of ``sa`` (the end of the corpus ranking
    first, as :func:`suffix_array` sorts it), sorted means each suffix's (first token, rank
    of the rest) is smaller than the next one's; by induction on the length, that is
    sorted."""
    n = len(sa)
    if n < 2:
        return None
    rank = np.empty(n + 1, dtype=np.int64)
    rank[sa] = np.arange(n)
    rank[n] = -1  # the empty suffix
    first, rest = tokens[sa].astype(np.int64), rank[sa + 1]
    ok = (first[:-1] < first[1:]) | ((first[:-1] == first[1:]) & (rest[:-1] < rest[1:]))
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else None

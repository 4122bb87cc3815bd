"""The EAGLE-3 head's reduced draft vocabulary: which target tokens it can propose.

:func:`build_draft_vocab` picks ``d2t`` from token counts (:func:`token_counts` of a
training window: output tokens first, prompt tokens to fill); :func:`vocab_rank` adds, for a
warm start, the incumbent's draft tokens right after the window's output tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from autospec.speculators.training import TrainSequence


def build_draft_vocab(token_counts: torch.Tensor | None, size: int, *, vocab_size: int,
                      always: Sequence[int] = ()) -> torch.Tensor:
    """``d2t`` (sorted ``int64 [size]``): the ``always`` ids (e.g. EOS) and the most frequent.

    ``token_counts``: ``[vocab_size]`` occurrence counts, or ``None`` (then the lowest
    ids fill the vocabulary). Ties go to the lower id.
    """
    if not 0 < size <= vocab_size:
        raise ValueError(f"size must be in [1, {vocab_size}], got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    if token_counts is not None:
        assert token_counts.shape == (vocab_size,), f"token_counts must be [{vocab_size}]"
        counts += token_counts.double()
    # rank by count, ties to the lower id; forced ids first
    score = counts - torch.arange(vocab_size, dtype=torch.float64) / (2 * vocab_size)
    forced = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size]
    score[forced] = float("inf")
    chosen = torch.topk(score, size).indices
    return chosen.sort().values.to(torch.long)


def token_counts(train: list[TrainSequence], vocab_size: int) -> torch.Tensor:
    """Output-token counts first, prompt tokens only to break ties / fill: ``[vocab_size]``."""
    out, prompt = Counter(), Counter()
    for seq in train:
        out.update(seq.ids[seq.prompt_len :])
        prompt.update(seq.ids[: seq.prompt_len])
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for table, weight in ((out, 1e6), (prompt, 1.0)):
        if table:
            ids = torch.tensor(list(table.keys()))
            keep = (ids >= 0) & (ids < vocab_size)
            counts[ids[keep]] += weight * torch.tensor(list(table.values()),
                                                       dtype=torch.float64)[keep]
    return counts


# a warm-start keeps the incumbent's draft tokens ahead of tokens seen only in prompts (below
# any output token, weighted 1e6 by token_counts, above any prompt count of a window)
INCUMBENT_TOKEN_WEIGHT = 1e5


def vocab_rank(counts: torch.Tensor, incumbent_d2t: torch.Tensor | None) -> torch.Tensor:
    """What the draft vocabulary is ranked by: the window's token counts, and for a
    warm-start the incumbent's draft tokens (``incumbent_d2t``) right after the window's
    output tokens. A window is small beside the data the incumbent (a base head above all)
    was trained on: filling the vocabulary's rest with the window's prompt tokens and the
    lowest ids would throw away trained LM-head rows of tokens the traffic has not shown
    yet, such as another domain's (a demo's base head, 8192 rows, kept 7145 of them when
    fine-tuned on 33 support requests that way; 8157 on 96 with the incumbent's tokens
    ranked here)."""
    if incumbent_d2t is None:
        return counts
    rank = counts.clone()
    rank[incumbent_d2t.cpu()] += INCUMBENT_TOKEN_WEIGHT
    return rank

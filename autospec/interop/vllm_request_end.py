"""Drafts that stop where the request can end, inside vLLM's model runner.

vLLM drafts k tokens at every step, even past ``max_tokens`` or past a stop token, and counts
in its per-request metrics the drafts the target would have accepted there, which it then
cuts from the output. autospec's engine and replay draft at most ``max_tokens - generated -
1`` tokens, so a request's last token is always a step's own, and they count a stop token
that ends the request as the step's own too, never as an accepted draft (drafting it saves
no step: the target's own token at that position is the same stop token). vLLM's summary
cannot tell these cases apart in general: its histogram counts only the steps that had
drafts, and on a step whose drafts a grammar refused from the first token (structured
outputs, synchronous scheduling) there are none, so the last step's over-count hides among
steps it does not report (issue 26: eagle3 under a JSON schema, 7 of 8 requests equal to
replay before the cut at ``max_tokens``; 5 of 8 once a head accepted the stop token as a
draft, before the cut before stop tokens, 2026-12-07).

Two users, one rule (:class:`RequestEnd`):

- autospec's suffix proposer (:mod:`autospec.interop.vllm_proposer`) drafts no further;
- :func:`cap_drafts` wraps the model runner's ``take_draft_token_ids`` — what vLLM's engine
  core hands its scheduler after each step under synchronous scheduling (vLLM's CPU
  platform, and any speculative method vLLM does not schedule asynchronously) — so the
  drafts of vLLM's own EAGLE/draft-model proposers are cut the same way before they are
  scheduled. Under asynchronous scheduling (EAGLE on a GPU) vLLM verifies the drafts on the
  device without that call; it also schedules and reports every step there, so the count
  :func:`autospec.engine.vllm.stats.vllm_stats` clips is exact without the cap.

Both read vLLM's model runner (``input_batch``, ``requests``, ``take_draft_token_ids``),
which has no public interface for this; ``tests/interop/test_vllm_request_end.py`` fails on
a vLLM that moves them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: the attribute marking a model runner whose drafts are already cut
_CAPPED = "_autospec_drafts_capped"


@dataclass(frozen=True)
class RequestEnd:
    """How a row's request can end: ``left`` drafts before ``max_tokens`` (its last token is
    the step's own); a token in ``stops`` at draft index ``>= stops_from`` (``min_tokens``
    out) ends it, and is left to the step's own token."""

    left: int
    stops: frozenset[int]
    stops_from: int

    def cut(self, draft: list[int]) -> list[int]:
        """``draft`` no longer than ``left``, and cut before its first token that would end
        the request: were that stop token accepted, the target's own token in its place
        would be the same one, so drafting it saves no step; left to the target, every
        request ends on a step's own token, as autospec's engine and replay count it."""
        draft = draft[: max(0, self.left)]
        for j in range(self.stops_from, len(draft)):
            if draft[j] in self.stops:
                return draft[:j]
        return draft


def _row_request(runner: Any, i: int) -> tuple[Any, Any]:
    """The request state in row ``i`` of ``runner``'s batch and its sampling parameters
    (None, None: a row the runner does not know)."""
    req_ids = runner.input_batch.req_ids
    state = runner.requests.get(req_ids[i]) if i < len(req_ids) else None
    return state, getattr(state, "sampling_params", None)


def request_extra(runner: Any, i: int) -> Mapping[str, Any]:
    """The ``extra_args`` of the sampling parameters of the request in row ``i`` of
    ``runner``'s batch (empty: none, or a row the runner does not know)."""
    _, params = _row_request(runner, i)
    return getattr(params, "extra_args", None) or {}


def request_end(runner: Any, i: int, n: int, k: int) -> RequestEnd | None:
    """Where the request in row ``i`` of ``runner``'s batch (``n`` tokens so far, prompt
    included) can end; None when the runner does not know the row's request."""
    state, params = _row_request(runner, i)
    if params is None:
        return None
    generated = n - int(state.num_prompt_tokens)
    left = k if params.max_tokens is None else params.max_tokens - generated - 1
    return RequestEnd(left=left, stops=frozenset(params.all_stop_token_ids),
                      stops_from=max(0, int(params.min_tokens) - generated))


def cap_drafts(runner: Any) -> bool:
    """Cut the drafts ``runner`` hands the scheduler where each request can end (module
    doc); False when they already are (idempotent)."""
    if getattr(runner, _CAPPED, False):
        return False
    take = runner.take_draft_token_ids

    def take_capped() -> Any:
        drafts = take()
        if drafts is None:
            return None
        return type(drafts)(drafts.req_ids, cut_rows(runner, drafts.req_ids,
                                                     drafts.draft_token_ids))

    runner.take_draft_token_ids = take_capped
    setattr(runner, _CAPPED, True)
    return True


def cut_rows(runner: Any, req_ids: list[str], rows: list[list[int]]) -> list[list[int]]:
    """Each request's drafts cut at its end (rows of requests the runner no longer holds,
    finished meanwhile, kept as they are)."""
    index = runner.input_batch.req_id_to_index
    out = []
    for req_id, draft in zip(req_ids, rows, strict=True):
        i = index.get(req_id)
        end = None if i is None else request_end(
            runner, i, int(runner.input_batch.num_tokens_no_spec[i]), len(draft))
        out.append(list(draft) if end is None else end.cut(list(draft)))
    return out

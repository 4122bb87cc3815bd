"""Drafts cut where the request can end (:mod:`autospec.interop.vllm_request_end`).

The rule on stand-in runners (plain namespaces with what vLLM's model runner holds), and the
pins: the vLLM parts it reads — the runner's ``take_draft_token_ids``, its batch's
``req_ids`` / ``req_id_to_index`` / ``num_tokens_no_spec``, a request's ``sampling_params``
and ``num_prompt_tokens``, the engine core handing the scheduler the runner's drafts under
synchronous scheduling — checked on the installed vLLM's classes, so an upgrade that moves
them fails here (real vLLM counting with the cap: tests/serve/test_vllm_live_tau.py)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from autospec.interop.vllm_request_end import RequestEnd, cap_drafts, cut_rows, request_end

EOS = 2


def test_cut_stops_at_max_tokens_and_before_a_stop_token() -> None:
    end = RequestEnd(left=2, stops=frozenset({EOS}), stops_from=0)
    assert end.cut([5, 6, 7, 8]) == [5, 6]
    # the stop token is left to the target: its own token there is the same one
    assert RequestEnd(left=4, stops=frozenset({EOS}), stops_from=0).cut([5, EOS, 7]) == [5]
    assert RequestEnd(left=4, stops=frozenset({EOS}), stops_from=0).cut([EOS, 7]) == []
    # a stop before min_tokens are out does not end the request
    assert RequestEnd(left=4, stops=frozenset({EOS}), stops_from=2).cut([EOS, 6, EOS, 9]) \
        == [EOS, 6]
    assert RequestEnd(left=0, stops=frozenset(), stops_from=0).cut([5]) == []
    assert RequestEnd(left=-1, stops=frozenset(), stops_from=0).cut([5]) == []


def _params(max_tokens: int | None, min_tokens: int = 0) -> Any:
    return SimpleNamespace(max_tokens=max_tokens, min_tokens=min_tokens,
                           all_stop_token_ids={EOS})


@dataclass
class _Drafts:  # the shape of vLLM's DraftTokenIds
    req_ids: list[str]
    draft_token_ids: list[list[int]]


def _runner(rows: dict[str, tuple[int, int, Any]], drafts: list[list[int]]) -> Any:
    """A stand-in model runner: ``rows`` req_id -> (prompt tokens, tokens so far, params)."""
    req_ids = list(rows)
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            num_tokens_no_spec=np.array([n for _, n, _ in rows.values()])),
        requests={r: SimpleNamespace(num_prompt_tokens=p, sampling_params=s)
                  for r, (p, _, s) in rows.items()})
    runner.take_draft_token_ids = lambda: _Drafts(list(req_ids), [list(d) for d in drafts])
    return runner


def test_request_end_reads_the_rows_request() -> None:
    runner = _runner({"a": (10, 15, _params(8)), "b": (4, 4, _params(None, min_tokens=3))},
                     [[1], [1]])
    assert request_end(runner, 0, 15, k=4) == RequestEnd(2, frozenset({EOS}), 0)
    assert request_end(runner, 1, 4, k=4) == RequestEnd(4, frozenset({EOS}), 3)
    assert request_end(runner, 5, 4, k=4) is None  # no such row


def test_cap_drafts_cuts_each_request_and_only_once() -> None:
    runner = _runner({"a": (10, 15, _params(8)),  # 5 generated: 2 drafts left
                      "b": (4, 6, _params(100)),  # far from its end; a stop drafted
                      "c": (3, 9, _params(6))},  # its last token is this step's own
                     [[7, 7, 7, 7], [5, EOS, 9, 9], [4, 4, 4, 4]])
    assert cap_drafts(runner) is True
    assert cap_drafts(runner) is False
    got = runner.take_draft_token_ids()
    assert isinstance(got, _Drafts) and got.req_ids == ["a", "b", "c"]
    assert got.draft_token_ids == [[7, 7], [5], []]


def test_rows_of_requests_gone_are_kept() -> None:
    runner = _runner({"a": (10, 15, _params(8))}, [[1, 1, 1]])
    assert cut_rows(runner, ["gone", "a"], [[9, 9, 9], [1, 1, 1]]) == [[9, 9, 9], [1, 1]]


def test_cap_passes_none_through() -> None:
    runner = _runner({}, [])
    runner.take_draft_token_ids = lambda: None
    cap_drafts(runner)
    assert runner.take_draft_token_ids() is None


# -- pins on the installed vLLM -----------------------------------------------------------------


def test_vllm_still_has_what_the_cap_reads() -> None:
    pytest.importorskip("vllm")
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert callable(GPUModelRunner.take_draft_token_ids)
    assert [f for f in DraftTokenIds.__dataclass_fields__] == ["req_ids", "draft_token_ids"]
    batch_init = inspect.getsource(InputBatch.__init__)
    for name in ("self.req_ids", "self.req_id_to_index", "self.num_tokens_no_spec"):
        assert name in batch_init or name.replace("self.", "def ") in inspect.getsource(
            InputBatch), name
    assert "sampling_params" in CachedRequestState.__dataclass_fields__
    assert "self.num_prompt_tokens" in inspect.getsource(CachedRequestState.__post_init__)
    params = SamplingParams(max_tokens=5, min_tokens=1, stop_token_ids=[7])
    assert 7 in params.all_stop_token_ids and params.min_tokens == 1
    # synchronous scheduling: the engine core hands the scheduler the runner's drafts
    step = inspect.getsource(EngineCore.post_step)
    assert "take_draft_token_ids" in step and "update_draft_token_ids" in step
    assert callable(Scheduler.update_draft_token_ids)


def test_vllm_cpu_schedules_synchronously() -> None:
    """The cap applies under synchronous scheduling, which vLLM's CPU platform forces."""
    pytest.importorskip("vllm")
    from vllm.platforms import cpu

    assert "scheduler_config.async_scheduling = False" in inspect.getsource(cpu)

"""A stop asked of one rank of a data-parallel group stops every rank before the same step:
two gloo ranks in processes of their own; only rank 1's ``should_stop`` ever says True.
Stopping it alone left rank 0 in the next all-reduce (a gloo error here; with DDP on a
cluster, a hang). A rank whose ``should_stop`` raises does not break the group either: every
rank ends before the same step, with an error naming the rank and its error."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from . import group_ranks


def _run_ranks(tmp_path: Path, plan: dict[int, tuple[int, str]]) -> list[dict]:
    """Both ranks in processes of their own; what each wrote of its end."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=group_ranks.rank,
                         args=(r, str(tmp_path / "store"), str(tmp_path), plan))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # spawned children import group_ranks by its test-package name (train.group_ranks)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))


def test_a_stop_one_rank_asks_for_stops_both_before_the_same_step(tmp_path: Path) -> None:
    ended = _run_ranks(tmp_path, {1: (10, "stop")})
    # 64 sequences, 4 a batch, 2 ranks: 8 steps an epoch; step 10 is in the second of 4
    assert ended == [{"ended": "TrainingStopped: stopped on request at step 10",
                      "steps": 10}] * 2, ended


def test_a_stop_question_that_raises_on_one_rank_ends_both_before_the_same_step(
        tmp_path: Path) -> None:
    """Rank 1's ``should_stop`` raises ``OSError`` before step 10: it used to leave the loop
    alone, and rank 0 waited in the all-reduce (for ever with NCCL's timeouts). Now both end
    there, each with the failing rank's error (so a Ray run fails with it, whichever rank's
    error Ray shows)."""
    ended = _run_ranks(tmp_path, {1: (10, "raise")})
    said = ("StopQuestionFailed: rank 1 could not ask whether to stop before step 10: "
            "OSError: [Errno 116] Stale file handle")
    assert ended == [{"ended": said, "steps": 10}] * 2, ended


def test_a_stop_another_rank_saw_wins_over_a_question_that_raised(tmp_path: Path) -> None:
    """The driver asked (rank 0 saw the marker) while rank 1 could not read it: the run
    stops on request, as asked, on both ranks."""
    ended = _run_ranks(tmp_path, {0: (6, "stop"), 1: (6, "raise")})
    assert ended == [{"ended": "TrainingStopped: stopped on request at step 6",
                      "steps": 6}] * 2, ended

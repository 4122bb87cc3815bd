"""A stop asked of one rank of a data-parallel group stops every rank before the same step:
two gloo ranks in processes of their own; only rank 1's ``should_stop`` ever says True.
Stopping it alone left rank 0 in the next all-reduce (a gloo error here; with DDP on a
cluster, a hang)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from . import group_ranks


def test_a_stop_one_rank_asks_for_stops_both_before_the_same_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spawned children import group_ranks by its test-package name (train.group_ranks)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=group_ranks.rank,
                         args=(r, str(tmp_path / "store"), str(tmp_path), 1, 10))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    ended = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # 64 sequences, 4 a batch, 2 ranks: 8 steps an epoch; step 10 is in the second of 4
    assert ended == [{"ended": "TrainingStopped: stopped on request at step 10",
                      "steps": 10}] * 2, ended
    assert [p.exitcode for p in procs] == [0, 0]

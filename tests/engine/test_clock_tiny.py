"""Timed regions wait for the device at both ends (kernels on GPUs run asynchronously)."""

from __future__ import annotations

import pytest
import torch

from autospec.engine import clock
from autospec.engine.costs import verify_cost
from autospec.engine.sampling import SamplingParams
from autospec.evaluate.replay import ReplayRequest, replay_request
from autospec.speculators.config import NgramConfig
from autospec.speculators.ngram import NgramSpeculator
from tests.tiny import tiny_target


@pytest.fixture()
def events(monkeypatch):
    log: list[tuple[str, object]] = []
    monkeypatch.setattr(clock, "synchronize", lambda device: log.append(("sync", device)))
    return log


def test_synchronize_waits_on_accelerators_only(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda d=None: waited.append(d))
    clock.synchronize(torch.device("cpu"))
    clock.synchronize(None)
    assert waited == []
    clock.synchronize("cuda:0")
    assert waited == [torch.device("cuda:0")]


def test_verify_cost_tiny_random_init_reads_the_clock_after_each_forward_ran(events):
    target = tiny_target(vocab_size=64, seed=0)
    forward = target.forward

    def logged_forward(ids, *args, **kwargs):
        events.append(("forward", len(ids)))
        return forward(ids, *args, **kwargs)

    target.forward = logged_forward  # type: ignore[method-assign]
    cost = verify_cost(target, sizes=(1, 3), context=16, repeats=2)
    timed = [name for name, _ in events[1:]]  # after the prompt's untimed forward
    assert timed == ["sync", "forward", "sync"] * 4
    # the sizes take turns in each repeat (a burst of load hits every size alike)
    assert [n for name, n in events[1:] if name == "forward"] == [1, 3, 1, 3]
    assert set(cost) == {1, 3} and all(s > 0 for s in cost.values())
    assert all(d == target.device for name, d in events if name == "sync")


class _Logged(NgramSpeculator):
    def __init__(self, log):
        super().__init__(NgramConfig(target_id="t", target_revision="r"))
        self.log = log

    def propose(self, k, sampling, generator):
        self.log.append(("propose", None))
        return super().propose(k, sampling, generator)


def test_replay_tiny_times_each_propose_to_its_end(events):
    spec = _Logged(events)
    req = ReplayRequest(prompt_ids=[1, 2, 3, 1, 2], output_ids=[3, 1, 2, 3, 1, 2, 3],
                        params=SamplingParams(max_new_tokens=7))
    replay_request(None, spec, req, k=3)
    names = [name for name, _ in events]
    assert names.count("propose") >= 2
    for i, name in enumerate(names):
        if name == "propose":
            assert names[i + 1] == "sync"  # the clock waits before draft_s adds the step

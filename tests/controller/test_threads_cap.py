"""The cap on a controller's torch threads (issue 28: a controller training on every core
starved the replica beside it): the policy's ``threads`` or ``--threads`` bounds the cycle's
torch work in the process, the training run's config carries it (Ray Train workers read it
there), the speed measurement runs within it, and the process's own count comes back."""

from __future__ import annotations

import torch

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.policy import Policy
from autospec.threads import resolve_threads, torch_threads

from .helpers import fast_policy, log_traffic


def _with_threads(policy: Policy, threads: object) -> Policy:
    return Policy.model_validate({**policy.model_dump(), "threads": threads})


def test_the_option_overrides_the_policy_and_auto_is_resolved_once(db, tiny) -> None:
    assert Controller(db, _with_threads(fast_policy(), 3), tiny).threads == 3
    assert Controller(db, _with_threads(fast_policy(), 3), tiny, threads=1).threads == 1
    auto = Controller(db, fast_policy(), tiny)
    assert auto.threads_setting == "auto" and auto.threads == resolve_threads("auto")


def test_a_cycle_trains_replays_and_measures_within_the_cap(db, tiny, traffic) -> None:
    with store.session_scope(db) as session:  # the replicas decode on 2 threads
        store.record_deployment(session, name="default", target="t",
                                target_id=tiny.info.target_id,
                                target_revision=tiny.info.revision, dtype=tiny.dtype_name,
                                actor="replica-a", threads=2)
    log_traffic(db, traffic)
    seen: list[int] = []
    with torch_threads(2):  # the process would compute on 2
        controller = Controller(db, fast_policy(), tiny, threads=1,
                                hooks={"registered": lambda: seen.append(torch.get_num_threads())})
        result = controller.run_cycle()
        assert torch.get_num_threads() == 2  # given back after the cycle
    assert result.evaluations, result.reasons
    assert seen == [1]  # training ran on the cap
    with store.session_scope(db, readonly=True) as session:
        (run,) = store.list_training_runs(session)
        evs = store.list_evaluations(session)
    assert run.config["threads"] == 1  # what the Ray Train workers would be handed
    # the replicas' 2 threads are above the cap: the measurement ran on 1, and says so
    assert evs and all(ev.per_segment["speed"]["threads"] == 1 for ev in evs)

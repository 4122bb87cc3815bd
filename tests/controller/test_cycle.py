"""The cycle on a tiny target: promote on a real gain, reject otherwise, once per window;
three controllers on one database run exactly one cycle per window."""

from __future__ import annotations

import threading
from datetime import timedelta

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller

from .helpers import T0, events, fast_policy, live_version, log_traffic


def _cycle_notes(engine, outcome: str | None = None) -> list:  # type: ignore[no-untyped-def]
    with store.session_scope(engine, readonly=True) as session:
        notes = records.notes(session, deployment="default", type_="cycle")
    return [n for n in notes if outcome is None or n.details["outcome"] == outcome]


def test_a_cycle_promotes_a_better_candidate_once_per_window(db, tiny, traffic) -> None:
    log_traffic(db, traffic)
    controller = Controller(db, fast_policy(), tiny)
    first = controller.run_cycle()
    assert first.outcome == "promoted" and first.exit_code == 0, first.reasons
    assert live_version(db) == first.promoted and first.promoted.startswith("suffix-")
    (promotion,) = [e for e in events(db, "promotion") if e.version == first.promoted]
    assert f"evaluation #{first.evaluations[0]}" in promotion.reason
    assert promotion.details["shadow_tau"] > 1 and promotion.from_version == "builtin-ngram"
    with store.session_scope(db, readonly=True) as session:
        (ev,) = store.list_evaluations(session, candidate=first.promoted)
        assert ev.decision == "promote" and ev.incumbent == "builtin-ngram"
        assert ev.deployment == "default"  # whose traffic it replayed
        assert ev.num_requests == len(traffic) - 28  # the held-out part only

    again = controller.run_cycle()
    assert again.outcome == "nothing_to_do" and "0 fresh requests" in again.reasons[0]
    assert len(_cycle_notes(db)) == 1


def test_the_cycle_measures_speed_on_the_threads_the_replicas_recorded(db, tiny, traffic) -> None:
    import torch

    with store.session_scope(db) as session:
        store.record_deployment(session, name="default", target="t", target_id=tiny.info.target_id,
                                target_revision=tiny.info.revision, dtype=tiny.dtype_name,
                                actor="replica-a", threads=1)
    log_traffic(db, traffic)
    before = torch.get_num_threads()
    result = Controller(db, fast_policy(), tiny).run_cycle()
    assert result.evaluations, result.reasons
    assert torch.get_num_threads() == before  # the controller's own threads, given back
    with store.session_scope(db, readonly=True) as session:
        evs = store.list_evaluations(session)
    assert evs and all(ev.per_segment["speed"]["threads"] == 1 for ev in evs)
    assert all("on 1 thread;" in " ".join(map(str, ev.reasons)) for ev in evs)


def test_not_enough_fresh_traffic_does_nothing(db, tiny, traffic) -> None:
    log_traffic(db, traffic[:10])
    result = Controller(db, fast_policy(), tiny).run_cycle()
    assert result.outcome == "nothing_to_do" and "10 fresh requests" in result.reasons[0]
    assert _cycle_notes(db) == [] and live_version(db) is None


def test_traffic_older_than_the_windows_max_age_is_not_fresh(db, tiny, traffic) -> None:
    """Unconsumed traffic older than ``window.max_age`` cannot enter a window: counted as
    fresh, it started a cycle whose window lacked it, failing at every interval."""
    log_traffic(db, traffic)  # 2 h old
    policy = fast_policy(window={"max_age": "1h"})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.outcome == "nothing_to_do", result.reasons
    assert "0 fresh requests" in result.reasons[0]
    assert _cycle_notes(db) == []


def test_a_rejected_candidate_consumes_the_window_and_exits_3(db, tiny, traffic) -> None:
    log_traffic(db, traffic)
    policy = fast_policy(gate={"min_gain": 50.0})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.outcome == "rejected" and result.exit_code == 3
    assert any("minimum gain" in r for r in result.reasons)
    assert live_version(db) is None
    with store.session_scope(db, readonly=True) as session:
        assert store.get_speculator(session, version=result.candidates[0]).state == "rejected"
    assert Controller(db, policy, tiny).run_cycle().outcome == "nothing_to_do"
    # fresh traffic makes a new window
    log_traffic(db, traffic, start=T0 + timedelta(minutes=10))
    assert Controller(db, policy, tiny).run_cycle().outcome == "rejected"
    assert len(_cycle_notes(db, "rejected")) == 2


def test_three_controllers_run_one_cycle_per_window(db_url, tiny, traffic) -> None:
    engines = [store.open_store(db_url, upgrade=True) for _ in range(3)]
    log_traffic(engines[0], traffic)
    policy = fast_policy()
    barrier = threading.Barrier(3)
    outcomes: list[str] = []

    def controller(engine) -> None:  # type: ignore[no-untyped-def]
        ctl = Controller(engine, policy, tiny)
        barrier.wait()
        for _ in range(3):
            outcomes.append(ctl.run_cycle(trigger="test").outcome)

    threads = [threading.Thread(target=controller, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert outcomes.count("promoted") == 1, outcomes
    assert set(outcomes) <= {"promoted", "busy", "nothing_to_do"}
    assert len(_cycle_notes(engines[0])) == 1
    with store.session_scope(engines[0], readonly=True) as session:
        assert len(store.list_speculators(session, kind="suffix")) == 1
        assert store.get_lease(session, name=records.lease_name("default")) is None
    for e in engines:
        e.dispose()


def test_of_two_passing_candidates_the_faster_one_is_promoted() -> None:
    from autospec.controller.candidates import Candidate, best_candidate

    slow = Candidate("eagle3-1", 1, tau=2.1, speedup=1.2, promote=True)
    fast = Candidate("suffix-1", 2, tau=1.9, speedup=1.9, promote=True)
    failed = Candidate("draft-1", 3, tau=3.0, speedup=2.5, promote=False)
    assert best_candidate([slow, fast, failed]) is fast
    assert best_candidate([slow, Candidate("x", 4, tau=2.2, speedup=1.2, promote=True)]).tau == 2.2
    assert best_candidate([failed]) is None


def test_on_a_vllm_deployment_a_cycle_trains_suffix_and_refuses_another_engine(
        db, tiny, traffic) -> None:
    """The replicas record engine vllm: an explicit ``native`` policy is refused before
    anything is trained; ``auto`` trains suffix (served by vLLM as autospec's proposer)."""
    from autospec import numerics

    numerics.record_served(db, deployment="default", spec="tiny", target=tiny, actor="r1",
                           engine="vllm")
    log_traffic(db, traffic)
    native = Controller(db, fast_policy(training={"engine": "native"}), tiny).run_cycle()
    assert native.outcome == "failed" and "`training.engine: auto`" in " ".join(native.reasons)
    assert native.candidates == []
    auto = Controller(db, fast_policy(), tiny).run_cycle()
    assert [c.split("-")[0] for c in auto.candidates] == ["suffix"], auto.reasons


def test_a_cycle_does_not_judge_on_requests_the_incumbent_was_trained_on(db, tiny,
                                                                          traffic) -> None:
    from autospec.train.data import WindowSpec
    from autospec.train.run import TrainRequest, train_candidate

    log_traffic(db, traffic)
    by_hand = train_candidate(TrainRequest(kind="suffix", window=WindowSpec(
        heldout_fraction=0.0)), engine=db, target=tiny).version  # every request indexed
    with store.session_scope(db) as session:
        store.set_live(session, version=by_hand, actor="test", reason="trained by hand")
    result = Controller(db, fast_policy(), tiny).run_cycle()
    assert result.outcome == "rejected" and live_version(db) == by_hand
    (reason,) = result.reasons  # (shortened in the cycle's record)
    assert "evaluation failed: every one of the 12 requests of cycle" in reason
    assert "held-out part was trai" in reason and "would not be held out" in reason


def test_the_policys_gpu_switch_reaches_the_ray_train_request(db, tiny, traffic,
                                                              monkeypatch) -> None:
    """``training: {workers: 2, use_gpu: true}`` (ops/kuberay/controller.yaml): the cycle asks
    Ray Train for GPU workers. The training itself is cut short here (no GPU, no Ray)."""
    import autospec.train.run as run
    from autospec.speculators.training import TrainingError

    asked = []

    def refuse(request, **_):  # type: ignore[no-untyped-def]
        asked.append(request)
        raise TrainingError("no GPU workers in this test")

    monkeypatch.setattr(run, "train_candidate", refuse)
    log_traffic(db, traffic)
    policy = fast_policy(training={"workers": 2, "use_gpu": True})
    result = Controller(db, policy, tiny).run_cycle()
    assert asked and all(r.use_gpu and r.workers == 2 for r in asked), asked
    assert "no GPU workers in this test" in " ".join(result.reasons)


def test_a_cycle_whose_every_evaluation_fails_is_failed_and_keeps_its_window(
        db, tiny, traffic, monkeypatch) -> None:
    """An incumbent that will not load (say) fails every candidate's evaluation: the cycle
    fails (exit 2), no candidate is rejected for it, and the next cycle retries the window."""
    import autospec.evaluate.run as run
    from autospec.versions import VersionLoadError

    def broken(**_):  # type: ignore[no-untyped-def]
        raise VersionLoadError("incumbent-x: artifact checksum mismatch")

    monkeypatch.setattr(run, "evaluate_versions", broken)
    log_traffic(db, traffic)
    result = Controller(db, fast_policy(), tiny).run_cycle()
    assert result.outcome == "failed" and result.exit_code == 2, result.reasons
    assert "no candidate could be evaluated" in " ".join(result.reasons)
    assert "checksum mismatch" in " ".join(result.reasons)
    with store.session_scope(db, readonly=True) as session:
        states = {s.version: s.state for s in store.list_speculators(session)}
    assert states and "rejected" not in states.values(), states
    monkeypatch.undo()
    assert Controller(db, fast_policy(), tiny).run_cycle().outcome == "promoted"


def test_an_operators_promotion_during_the_cycle_is_not_overwritten(db, tiny, traffic,
                                                                      tmp_path) -> None:
    """The cycle evaluated against builtin-ngram; an operator made v-op live meanwhile: the
    pointer keeps the operator's version, the cycle fails naming the move (exit 2)."""
    from tests.store.test_registry import register

    def operator_moves() -> None:
        with store.session_scope(db) as session:
            register(session, tmp_path, "v-op")
            store.set_live(session, version="v-op", actor="op", reason="by hand",
                           kind="override")

    log_traffic(db, traffic)
    result = Controller(db, fast_policy(), tiny, hooks={"evaluated": operator_moves}).run_cycle()
    assert result.outcome == "failed", result.reasons
    assert "moved from builtin-ngram to v-op during the cycle" in result.reasons[-1]
    assert live_version(db) == "v-op"


def test_a_cycle_rejecting_all_after_an_operators_promotion_fails_and_keeps_its_window(
        db, tiny, traffic, tmp_path) -> None:
    """Every candidate fails the gate, but against builtin-ngram, no longer live: none is
    marked rejected, the cycle fails naming the move and its window is left to the next."""
    from autospec.controller import records
    from tests.store.test_registry import register

    def operator_moves() -> None:
        with store.session_scope(db) as session:
            register(session, tmp_path, "v-op")
            store.set_live(session, version="v-op", actor="op", reason="by hand")

    log_traffic(db, traffic)
    result = Controller(db, fast_policy(gate={"min_gain": 5.0}), tiny,
                        hooks={"evaluated": operator_moves}).run_cycle()
    assert result.outcome == "failed", result.reasons
    assert "moved from builtin-ngram to v-op during the cycle" in result.reasons[-1]
    assert result.candidates
    with store.session_scope(db, readonly=True) as s:
        assert {store.get_speculator(s, version=v).state for v in result.candidates} \
            .isdisjoint({"rejected"})
        assert not records.window_done(s, deployment="default", window_key=result.window_key)

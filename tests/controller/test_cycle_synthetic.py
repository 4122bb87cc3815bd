"""A cycle with synthetic data on: the window mixes it in at the share, the evaluation
reports held-out synthetic τ beside real τ, and the real held-out set stays traffic only."""

from __future__ import annotations

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.status import last_evaluation
from autospec.synth.run import SynthRequest, synthesize

from .helpers import fast_policy, log_traffic


def test_a_cycle_trains_on_the_mix_and_reports_both_taus(db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    synthesize(SynthRequest(count=40, max_new_tokens=12, heldout_fraction=0.3),
               engine=db, target=tiny)
    policy = fast_policy(training={"synthetic": {"share": 0.25, "heldout_sequences": 16}})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.outcome in ("promoted", "rejected"), result.reasons
    with store.session_scope(db, readonly=True) as session:
        (run,) = store.list_training_runs(session)
        (ev,) = store.list_evaluations(session)
        shown = last_evaluation(session)
    window = run.metrics["window"]
    assert window["synthetic_sequences"] > 0  # train_requests: real requests only
    assert run.train_requests == window["train_requests"] == len(traffic) - ev.num_requests
    assert ev.num_requests == window["heldout_requests"] == len(traffic) - 28  # real only
    synthetic = ev.per_segment["synthetic"]
    assert 0 < synthetic["num_sequences"] <= 16
    assert set(synthetic["tau"]) == {ev.candidate, "builtin-ngram"}
    assert shown["tau_synthetic"] == synthetic["tau"] and shown["tau_real"][ev.candidate]


def _with_base(db, tiny, traffic) -> str:  # type: ignore[no-untyped-def]
    from autospec.synth.pretrain import PretrainRequest, pretrain_base

    log_traffic(db, traffic)
    synthesize(SynthRequest(count=20, max_new_tokens=12), engine=db, target=tiny)
    return pretrain_base(PretrainRequest(per_domain=0, epochs=1,
                                         overrides={"draft_vocab_size": 40}),
                         engine=db, target=tiny).version


def test_a_cycles_eagle3_candidate_starts_from_the_base_head_and_both_are_evaluated(
        db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    base = _with_base(db, tiny, traffic)
    policy = fast_policy(training={"kinds": ["eagle3"], "epochs": 1})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.candidates and result.bases == [base], result.reasons
    with store.session_scope(db, readonly=True) as session:
        cand = store.get_speculator(session, version=result.candidates[0])
        evaluated = {ev.candidate for ev in store.list_evaluations(session)}
    assert cand.parent == base  # the live version is the built-in n-gram one
    assert evaluated == {cand.version, base}  # each against the incumbent, on the same window


def test_a_base_that_fails_the_gate_is_not_rejected_and_stays_the_starting_point(
        db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    from autospec.train.run import base_version

    base = _with_base(db, tiny, traffic)
    policy = fast_policy(training={"kinds": ["eagle3"], "epochs": 1},
                         gate={"min_gain": 50.0})  # nothing can pass
    result = Controller(db, policy, tiny).run_cycle()
    assert result.outcome == "rejected" and result.bases == [base], result.reasons
    assert any(r.startswith(f"{base} (base): ") for r in result.reasons)
    with store.session_scope(db, readonly=True) as session:
        assert store.get_speculator(session, version=result.candidates[0]).state == "rejected"
        assert store.get_speculator(session, version=base).state == "candidate"
        assert base_version(session, "eagle3", tiny) == base


def test_evaluate_base_off_evaluates_the_fine_tune_alone(db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    _with_base(db, tiny, traffic)
    policy = fast_policy(training={"kinds": ["eagle3"], "epochs": 1, "evaluate_base": False})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.candidates and result.bases == [], result.reasons
    assert len(result.evaluations) == 1

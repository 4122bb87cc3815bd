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


def test_a_cycles_eagle3_candidate_starts_from_the_base_head(db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    from autospec.synth.pretrain import PretrainRequest, pretrain_base

    log_traffic(db, traffic)
    synthesize(SynthRequest(count=20, max_new_tokens=12), engine=db, target=tiny)
    base = pretrain_base(PretrainRequest(per_domain=0, epochs=1,
                                         overrides={"draft_vocab_size": 40}),
                         engine=db, target=tiny).version
    policy = fast_policy(training={"kinds": ["eagle3"], "epochs": 1})
    result = Controller(db, policy, tiny).run_cycle()
    assert result.candidates, result.reasons
    with store.session_scope(db, readonly=True) as session:
        cand = store.get_speculator(session, version=result.candidates[0])
    assert cand.parent == base  # the live version is the built-in n-gram one

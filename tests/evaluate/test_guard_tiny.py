"""The overfitting guard end to end on a tiny target and a real SQLite store.

A suffix candidate that memorised the held-out synthetic sequences has a large synthetic
gain and none on real traffic: the evaluation reports both τs, the gate decides on the real
one, and the guard's reason leads the rejection, in the store, the JSON and ``status``.
"""

import pytest

from autospec import store
from autospec.controller.evaluate_cli import _as_json
from autospec.controller.status import last_evaluation
from autospec.evaluate.gate import GatePolicy
from autospec.evaluate.run import evaluate_versions, select_requests
from autospec.evaluate.speed_settings import SpeedSettings
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.config import SuffixConfig
from autospec.speculators.suffix import suffix_from_documents
from autospec.synth.run import SynthRequest, synthesize
from autospec.train.run import synthetic_target
from tests.train.conftest import greedy_traffic, log_traffic

K = 4
POLICY = GatePolicy(min_heldout=10, min_gain=0.05)
OFF = SpeedSettings(enabled=False)


@pytest.fixture
def db(sqlite_url, tiny):
    engine = store.open_store(sqlite_url, upgrade=True)
    log_traffic(engine, greedy_traffic(tiny, 30, output_len=16))
    synthesize(SynthRequest(count=30, max_new_tokens=16, temperature=1.0,
                            heldout_fraction=0.5), engine=engine, target=tiny)
    yield engine
    engine.dispose()


def _memoriser(db, tiny, tmp_path) -> str:
    """A suffix candidate indexing exactly the held-out synthetic sequences."""
    with store.session_scope(db, readonly=True) as session:
        rows = store.select_synthetic(session, target=synthetic_target(tiny), split="heldout")
    spec = suffix_from_documents(SuffixConfig.for_target(tiny.info),
                                 [(r.prompt_ids, r.output_ids) for r in rows], tiny)
    sha = save_speculator(spec, tmp_path / "suffix-mem")
    with store.session_scope(db) as session:
        store.register_speculator(session, version="suffix-mem", kind="suffix",
                                  target_id=tiny.info.target_id,
                                  target_revision=tiny.info.revision,
                                  artifact_uri=str(tmp_path / "suffix-mem"), sha256=sha)
    return "suffix-mem"


def test_a_synthetic_only_gain_is_rejected_by_the_guard(db, tiny, tmp_path):
    cand = _memoriser(db, tiny, tmp_path)
    report = evaluate_versions(db=db, target=tiny, versions=[cand, "builtin-ngram"],
                               examples=select_requests(db, last=100), k=K, policy=POLICY,
                               speed=OFF)
    ev, syn = report.evaluation, report.evaluation.synthetic
    assert syn is not None and syn.num_sequences > 5
    assert syn.delta.low >= POLICY.min_gain > ev.delta.low  # gain on synthetic only
    assert not report.decision.promote
    first = report.decision.reasons[0]
    assert first.startswith("overfitting guard:")
    assert f"{syn.delta.delta:+.3f}" in first and f"{ev.delta.delta:+.3f}" in first
    data = _as_json(report)  # the evaluation JSON: both τs
    assert data["tau"][cand] == ev.tau[cand] and data["synthetic"]["tau"][cand] == syn.tau[cand]
    with store.session_scope(db, readonly=True) as session:
        shown = last_evaluation(session)
    assert shown["overfits"] and shown["decision"] == "reject"
    assert shown["tau_real"][cand] == pytest.approx(ev.tau[cand])
    assert shown["tau_synthetic"][cand] == pytest.approx(syn.tau[cand])


def test_without_synthetic_sequences_only_real_tau(db, tiny, tmp_path):
    cand = _memoriser(db, tiny, tmp_path)
    report = evaluate_versions(db=db, target=tiny, versions=[cand, "builtin-ngram"],
                               examples=select_requests(db, last=100), k=K, policy=POLICY,
                               speed=OFF, synthetic_heldout=0)
    assert report.evaluation.synthetic is None
    assert not any(r.startswith("overfitting guard") for r in report.decision.reasons)
    with store.session_scope(db, readonly=True) as session:
        shown = last_evaluation(session)
    assert shown["tau_synthetic"] is None and not shown["overfits"]

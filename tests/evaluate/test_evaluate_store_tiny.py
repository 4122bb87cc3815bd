"""Shadow evaluation against a real SQLite store, on a tiny random-init target."""

import pytest

from autospec import store
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.evaluate.gate import GatePolicy
from autospec.evaluate.run import EvaluationError, evaluate_versions, select_requests
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator
from autospec.versions import VersionLoadError
from tests.tiny import tiny_target

K = 4


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=64, seed=0)


@pytest.fixture
def db(sqlite_url):
    return store.open_store(sqlite_url, upgrade=True)


def _register(db, target, tmp_path, version, kind, target_id=None):
    path = tmp_path / version
    sha = save_speculator(new_speculator(kind, target), path)
    with store.session_scope(db) as session:
        store.register_speculator(session, version=version, kind=kind,
                                  target_id=target_id or target.info.target_id,
                                  artifact_uri=str(path), sha256=sha, verify=False)


def _serve_and_log(db, target, n=24):
    """Decode n requests live with ngram and log them as serving does."""
    engine = SpeculativeEngine(target, new_speculator("ngram", target), K)
    records = []
    for i in range(n):
        prompt = [(i % 7) + 1, 2, 3, 4, (i % 5) + 1, 2, 3, 4, 5]
        params = SamplingParams(max_new_tokens=20, ignore_eos=True)
        res = engine.generate(prompt, params)
        s = res.stats
        records.append(store.RequestRecord(
            prompt_ids=prompt, output_ids=res.token_ids, segment=["a", "b"][i % 2],
            speculator_version="ngram-live", sampling={"max_tokens": 20, "k": K},
            num_drafts=s.num_drafts, num_draft_tokens=s.num_draft_tokens,
            num_accepted_tokens=s.num_accepted_tokens,
            accepted_per_position=s.accepted_per_position, output_tokens=s.output_tokens))
    store.write_requests(db, records)
    return records


def test_shadow_tau_agrees_with_live_and_evaluation_is_recorded(db, target, tmp_path):
    records = _serve_and_log(db, target)
    live_tau = (sum(r.num_accepted_tokens for r in records) + sum(r.num_drafts for r in records)) \
        / sum(r.num_drafts for r in records)
    assert live_tau > 1.1  # the repetitive prompts give ngram something to accept
    _register(db, target, tmp_path, "ngram-live", "ngram")
    _register(db, target, tmp_path, "eagle3-x", "eagle3")
    examples = select_requests(db, last=100)
    assert len(examples) == len(records)
    report = evaluate_versions(db=db, target=target, versions=["eagle3-x", "ngram-live"],
                               examples=examples, k=K, policy=GatePolicy(min_heldout=10))
    ev = report.evaluation
    assert abs(ev.tau["ngram-live"] - live_tau) <= 0.02 * live_tau
    assert not report.decision.promote  # an untrained head does not beat ngram here
    assert {s.segment for s in ev.segments} == {"a", "b"}
    with store.session_scope(db, readonly=True) as session:
        rows = store.list_evaluations(session)
    assert len(rows) == 1 and rows[0].id == report.evaluation_id
    assert rows[0].decision == "reject" and rows[0].reasons


def test_bad_input_is_a_clear_error(db, target, tmp_path):
    with pytest.raises(EvaluationError, match="no usable requests"):
        evaluate_versions(db=db, target=target, versions=["builtin-ngram"], examples=[])
    _serve_and_log(db, target, n=2)
    examples = select_requests(db, last=10)
    with pytest.raises(VersionLoadError, match="'nope' is not registered"):
        evaluate_versions(db=db, target=target, versions=["nope"], examples=examples)
    _register(db, target, tmp_path, "other-1", "ngram", target_id="some-other-model")
    with pytest.raises(VersionLoadError, match="is for target 'some-other-model'"):
        evaluate_versions(db=db, target=target, versions=["other-1"], examples=examples)


def test_requests_decoded_under_settings_replay_cannot_apply_are_left_out_and_counted(
        db, target, tmp_path):
    _serve_and_log(db, target, n=20)
    constrained = _serve_and_log(db, target, n=6)
    with store.session_scope(db) as session:  # as a vLLM replica logs a JSON-schema request
        from sqlalchemy import update

        from autospec.store.models import Request
        session.execute(update(Request).where(Request.id > 20).values(sampling={
            "max_tokens": 20, "k": K, "unreplayable": ["structured_outputs"],
            "vllm": {"structured_outputs": {"json": {"type": "object"}}}}))
    _register(db, target, tmp_path, "ngram-live", "ngram")
    examples = select_requests(db, last=100)
    assert len(examples) == 20 + len(constrained)
    report = evaluate_versions(db=db, target=target, versions=["builtin-ngram", "ngram-live"],
                               examples=examples, k=K, policy=GatePolicy(min_heldout=10),
                               record=False)
    assert report.evaluation.num_requests == 20 and report.evaluation.unreplayable == 6
    from autospec.evaluate.gate import _size

    assert "6 more left out" in _size(GatePolicy(min_heldout=10), report.evaluation)[1]
    with pytest.raises(EvaluationError, match=r"all 6 requests .* replay cannot apply"):
        evaluate_versions(db=db, target=target, versions=["builtin-ngram"],
                          examples=examples[20:], k=K)


def test_replay_applies_the_logit_bias_a_request_was_served_with():
    from datetime import datetime

    from autospec.evaluate.run import to_replay_request
    from autospec.store.queries import TrafficExample

    ex = TrafficExample(id=1, request_uid="u", created_at=datetime(2026, 1, 1), segment="s",
                        speculator_version=None, prompt_ids=[1], output_ids=[2, 3],
                        temperature=0.7, sampling={"max_tokens": 2, "logit_bias": {"5": -3.0}},
                        num_drafts=1, num_accepted_tokens=0)
    assert to_replay_request(ex).params.logit_bias == ((5, -3.0),)


def test_replay_applies_the_penalties_a_request_was_served_with():
    from datetime import datetime

    from autospec.evaluate.run import to_replay_request
    from autospec.store.queries import TrafficExample

    def example(sampling):
        return TrafficExample(id=1, request_uid="u", created_at=datetime(2026, 1, 1),
                              segment="s", speculator_version=None, prompt_ids=[1],
                              output_ids=[2, 3], temperature=0.7, sampling=sampling,
                              num_drafts=1, num_accepted_tokens=0)

    params = to_replay_request(example({"frequency_penalty": 0.5,
                                        "presence_penalty": 0.25})).params
    assert (params.frequency_penalty, params.presence_penalty) == (0.5, 0.25)

"""Runs end to end on tiny random-init targets: registration, warm start, failures, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autospec import store
from autospec.settings import get_settings
from autospec.speculators.checkpoint import load_speculator, save_speculator
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.train.data import WindowSpec
from autospec.train.errors import EmptyWindow, IncumbentMismatch, TrainingStopped, WindowTooSmall
from autospec.train.run import TrainRequest, train_candidate

EAGLE = {"draft_vocab_size": 40}


def _request(kind: str = "eagle3", **kw) -> TrainRequest:
    kw.setdefault("overrides", EAGLE if kind == "eagle3" else {})
    return TrainRequest(kind=kind, epochs=kw.pop("epochs", 2),
                        window=kw.pop("window", WindowSpec(heldout_fraction=0.2)), **kw)


def _artifacts() -> list[Path]:
    root = get_settings().resolved_artifact_dir
    return sorted(root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("kind", ["eagle3", "draft", "suffix"])
def test_run_tiny_random_init_registers_a_candidate(db_with_traffic, tiny, kind) -> None:
    outcome = train_candidate(_request(kind), engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic) as s:
        row = store.get_speculator(s, version=outcome.version)
        run = store.get_training_run(s, run_id=outcome.run_id)
        assert (row.state, row.kind, row.parent, row.sha256) == ("candidate", kind, None,
                                                                 outcome.sha256)
        assert row.training_run_id == run.id and row.target_revision == tiny.info.revision
        assert run.status == "succeeded" and run.version == outcome.version
        assert run.finished_at is not None and run.train_requests == 48
        assert run.metrics["window"]["heldout_requests"] == 12
        assert run.metrics["examples_seen"] > 0
        if kind != "suffix":
            assert len(run.metrics["loss_curve"]) >= 2
    assert _artifacts() == [outcome.artifact]  # no partial directory left behind
    spec = load_speculator(outcome.artifact, tiny)  # verified manifest, safetensors only
    assert spec.kind == kind
    if kind == "eagle3":  # the suffix index over the training window rides with the head
        assert spec.config.suffix_tokens == run.metrics["suffix_tokens"] > 0
        assert spec.suffix is not None and spec.suffix.corpus_tokens == spec.config.suffix_tokens


def test_run_tiny_random_init_eagle3_without_a_suffix_index(db_with_traffic, tiny) -> None:
    request = _request(epochs=1, overrides={**EAGLE, "suffix_threshold": None})
    outcome = train_candidate(request, engine=db_with_traffic, target=tiny)
    spec = load_speculator(outcome.artifact, tiny)
    assert spec.config.suffix_tokens == 0 and spec.suffix is None
    assert "suffix_tokens" not in outcome.metrics


def test_run_tiny_random_init_warm_starts_from_live_with_a_new_draft_vocab(
        db_with_traffic, tiny) -> None:
    first = train_candidate(_request(), engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic) as s:
        store.set_live(s, version=first.version, actor="test", reason="test")
    second = train_candidate(_request(overrides={"draft_vocab_size": 48}),
                             engine=db_with_traffic, target=tiny)
    assert second.parent == first.version
    assert second.metrics["init"] == "incumbent"
    assert second.metrics["draft_vocab_rows_kept"] == 40  # every old row still exists
    scratch = train_candidate(_request(from_scratch=True), engine=db_with_traffic, target=tiny)
    assert scratch.parent is None and scratch.metrics["init"] == "target-lm-head"


def test_warm_start_tiny_random_init_keeps_rows_that_still_exist(tiny) -> None:
    from autospec.speculators.eagle3.training import warm_start_eagle3
    from autospec.speculators.registry import new_speculator

    old = new_speculator("eagle3", tiny, draft_vocab_size=16)
    assert isinstance(old, Eagle3Speculator)
    old.head.set_draft_vocab(torch.arange(16) * 2)  # even ids
    torch.nn.init.normal_(old.head.lm_head.weight)
    new = new_speculator("eagle3", tiny, draft_vocab_size=20)
    new_d2t = torch.cat([torch.arange(0, 20, 2), torch.arange(41, 60, 2)])  # 10 kept, 10 new
    kept = warm_start_eagle3(new, old, new_d2t, tiny)
    assert kept == 10
    for j, t in enumerate(new_d2t.tolist()):
        if t < 20:
            torch.testing.assert_close(new.head.lm_head.weight[j],
                                       old.head.lm_head.weight[t // 2])
        else:  # a new token: the target's own LM-head row
            torch.testing.assert_close(new.head.lm_head.weight[j],
                                       tiny.model.lm_head.weight[t].to(new.head.lm_head.weight))
    torch.testing.assert_close(new.head.fc.weight, old.head.fc.weight)


def test_warm_start_tiny_random_init_keeps_the_incumbents_tokens_the_window_lacks(tiny):
    """A small window does not push the incumbent's trained rows out of the draft
    vocabulary: its output tokens first, then the incumbent's, then its prompt tokens."""
    from autospec.speculators.eagle3 import Eagle3Recipe
    from autospec.speculators.registry import new_speculator
    from autospec.train.data import TrainSequence

    old = new_speculator("eagle3", tiny, draft_vocab_size=16)
    assert isinstance(old, Eagle3Speculator)
    old_d2t = torch.arange(40, 56)  # ids the window below never shows
    old.head.set_draft_vocab(old_d2t)
    window = [TrainSequence(ids=[1, 2, 3, 4, 10, 11, 12, 10], prompt_len=4)]
    new = new_speculator("eagle3", tiny, draft_vocab_size=24)
    info = Eagle3Recipe().prepare(new, window, tiny, old)
    d2t = set(new.head.d2t.tolist())
    assert {10, 11, 12} <= d2t  # the window's outputs
    assert set(old_d2t.tolist()) <= d2t  # every incumbent token, its row kept
    assert info["draft_vocab_rows_kept"] == 16
    assert len(d2t & {1, 2, 3, 4}) == 24 - 3 - 16 - len(d2t & set(tiny.info.eos_token_ids))
    scratch = new_speculator("eagle3", tiny, draft_vocab_size=24)
    Eagle3Recipe().prepare(scratch, window, tiny, None)  # from scratch: lowest ids fill up
    assert not set(old_d2t.tolist()) & set(scratch.head.d2t.tolist())


def test_checkpoint_tiny_random_init_trained_head_round_trips(db_with_traffic, tiny,
                                                              tmp_path) -> None:
    outcome = train_candidate(_request(), engine=db_with_traffic, target=tiny)
    spec = load_speculator(outcome.artifact, tiny)
    again = tmp_path / "again"
    assert save_speculator(spec, again) == outcome.sha256  # bit-identical artifact


def test_run_tiny_random_init_stopped_registers_nothing_and_records_why(
        db_with_traffic, tiny) -> None:
    steps = []

    def stop() -> bool:
        steps.append(1)
        return len(steps) >= 3

    with pytest.raises(TrainingStopped, match="stopped on request at step 3"):
        train_candidate(_request(), engine=db_with_traffic, target=tiny, should_stop=stop)
    with store.session_scope(db_with_traffic) as s:
        assert [v.version for v in store.list_speculators(s)] == ["builtin-ngram"]
        (run,) = store.list_training_runs(s)
        assert run.status == "failed" and run.error.startswith("stopped")
        assert run.version is None and run.finished_at is not None
    assert _artifacts() == []


def test_run_bad_input_is_a_clear_error_and_records_no_run(db_with_traffic, tiny, other_tiny,
                                                           tmp_path) -> None:
    with pytest.raises(WindowTooSmall, match="policy minimum is 100"):
        train_candidate(_request(min_requests=100), engine=db_with_traffic, target=tiny)
    first = train_candidate(_request(), engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic) as s:
        store.set_live(s, version=first.version, actor="test", reason="test")
    with pytest.raises(IncumbentMismatch, match="built for target 'tiny-llama-0'"):
        train_candidate(_request(), engine=db_with_traffic, target=other_tiny)
    with pytest.raises(IncumbentMismatch, match="is a eagle3 speculator, not draft"):
        train_candidate(_request("draft", incumbent=first.version), engine=db_with_traffic,
                        target=tiny)
    with store.session_scope(db_with_traffic) as s:
        assert len(store.list_training_runs(s)) == 1  # only the successful one
    empty = store.open_store(f"sqlite:///{tmp_path / 'empty.db'}", upgrade=True)
    with pytest.raises(EmptyWindow):
        train_candidate(_request(), engine=empty, target=tiny)
    empty.dispose()


def test_run_tiny_random_init_bfloat16_target_is_left_untouched(db_with_traffic) -> None:
    """Training in float32 must not cast the target tensors a draft or head borrows."""
    from tests.tiny import tiny_target

    target = tiny_target(dtype=torch.bfloat16)
    for kind in ("draft", "eagle3"):
        train_candidate(_request(kind, epochs=1), engine=db_with_traffic, target=target)
        assert {p.dtype for p in target.model.parameters()} == {torch.bfloat16}
        target.forward(torch.arange(5), target.new_cache())  # still runs


def test_run_tiny_random_init_writes_the_artifact_where_the_request_says(
        db_with_traffic, tiny, tmp_path: Path) -> None:
    """A caller (bench train) names the artifact directory; no environment, no settings."""
    where = tmp_path / "bench-artifacts"
    outcome = train_candidate(_request("suffix", artifact_dir=where), engine=db_with_traffic,
                              target=tiny)
    assert outcome.artifact.parent == where and outcome.artifact.is_dir()
    assert _artifacts() == []  # nothing in the settings' artifact directory


def test_eagle3_tiny_random_init_index_carries_the_targets_own_answers_not_old_traffic(tiny):
    """From scratch the index's carried part is the window's synthetic answers; a head
    warm-started from it carries that part on and rebuilds the rest from its own window."""
    from autospec.speculators.eagle3 import Eagle3Recipe
    from autospec.speculators.registry import new_speculator
    from autospec.speculators.suffix import build_corpus
    from autospec.train.data import TrainSequence, documents

    synthetic = [TrainSequence(ids=[1, 2, 20, 21, 22], prompt_len=2, synthetic=True)]
    old_traffic = [TrainSequence(ids=[3, 4, 30, 31], prompt_len=2)]
    new_traffic = [TrainSequence(ids=[5, 6, 40, 41, 42], prompt_len=2)]
    first = new_speculator("eagle3", tiny, draft_vocab_size=32)
    Eagle3Recipe().finish(first, synthetic + old_traffic, tiny, None)
    carried = build_corpus(documents(synthetic), first.suffix.config.prompt_tail)
    assert first.config.suffix_carried_tokens == len(carried) > 0
    assert first.carried_corpus().tolist() == carried.tolist()
    assert first.suffix.corpus_tokens > len(carried)  # the traffic follows

    second = new_speculator("eagle3", tiny, draft_vocab_size=32)
    info = Eagle3Recipe().finish(second, new_traffic, tiny, first)
    assert info["suffix_carried_tokens"] == len(carried)
    corpus = second.suffix.corpus_prefix(second.suffix.corpus_tokens).tolist()
    assert corpus[: len(carried)] == carried.tolist()
    assert 40 in corpus and 30 not in corpus  # the old window's traffic is not carried

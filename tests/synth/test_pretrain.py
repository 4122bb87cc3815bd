"""``pretrain_base``: a base eagle3 head from synthetic data, reused as the warm start."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.synth.pretrain import PretrainRequest, pretrain_base
from autospec.synth.run import SynthError, SynthRequest, synthesize
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate

EAGLE = {"draft_vocab_size": 40}


def _base(db, tiny) -> str:  # type: ignore[no-untyped-def]
    synthesize(SynthRequest(count=30, max_new_tokens=12, heldout_fraction=0.2),
               engine=db, target=tiny)
    outcome = pretrain_base(PretrainRequest(per_domain=0, epochs=1, overrides=EAGLE),
                            engine=db, target=tiny)
    return outcome.version


def test_a_base_head_is_registered_marked_and_reads_no_traffic(db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    version = _base(db_with_traffic, tiny)
    with store.session_scope(db_with_traffic, readonly=True) as session:
        row = store.get_speculator(session, version=version)
        run = store.get_training_run(session, run_id=row.training_run_id)
    assert row.kind == "eagle3" and row.meta["base"] is True and row.parent is None
    assert run.train_requests == 0  # synthetic sequences only
    assert run.metrics["window"]["synthetic_sequences"] == row.meta["synthetic_sequences"] > 0
    from autospec.controller.operations import list_versions

    listed = {r["version"]: r["base"] for r in list_versions(db_with_traffic, state=None,
                                                             limit=50)}
    assert listed[version] is True and not listed.get("builtin-ngram")  # `autospec versions`


def test_eagle3_starts_from_the_base_unless_an_eagle3_is_live(db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    base = _base(db_with_traffic, tiny)
    request = TrainRequest(kind="eagle3", epochs=1, window=WindowSpec(heldout_fraction=0.2),
                           overrides=EAGLE)
    first = train_candidate(request, engine=db_with_traffic, target=tiny)
    assert first.parent == base  # the live version is the built-in n-gram one
    with store.session_scope(db_with_traffic) as session:
        store.set_live(session, version=first.version, actor="test", reason="test")
    second = train_candidate(request, engine=db_with_traffic, target=tiny)
    assert second.parent == first.version  # a live eagle3 head wins over the base
    scratch = train_candidate(TrainRequest(**{**request.__dict__, "from_scratch": True}),
                              engine=db_with_traffic, target=tiny)
    assert scratch.parent is None


def test_nothing_to_pretrain_on_and_domains_without_a_tokenizer(db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SynthError, match="no synthetic sequences of tiny-llama-0"):
        pretrain_base(PretrainRequest(per_domain=0), engine=db_with_traffic, target=tiny)
    with pytest.raises(SynthError, match="has no tokenizer"):
        pretrain_base(PretrainRequest(per_domain=2), engine=db_with_traffic, target=tiny)
    with pytest.raises(SynthError, match="unknown domains"):
        pretrain_base(PretrainRequest(domains=("poetry",)), engine=db_with_traffic, target=tiny)


def test_a_base_head_from_every_workload_domain(tmp_path, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target
    from tests.controller.helpers import make_tokenizer_model_dir

    target = load_target(str(make_tokenizer_model_dir(tmp_path / "tok")), dtype="float32")
    engine = store.open_store(sqlite_url, upgrade=True)  # no traffic at all
    request = PretrainRequest(per_domain=4, epochs=1, overrides={"draft_vocab_size": 64},
                              synth=SynthRequest(max_new_tokens=8, heldout_fraction=0.25))
    outcome = pretrain_base(request, engine=engine, target=target)
    with store.session_scope(engine, readonly=True) as session:
        row = store.get_speculator(session, version=outcome.version)
        counts = store.count_synthetic(session)
    assert row.meta["domains"] == ["coding", "json", "support"]
    assert {source for source, _ in counts} == {"domain:coding", "domain:json", "domain:support"}
    assert sum(n for (_, split), n in counts.items() if split == "train") \
        == row.meta["synthetic_sequences"]
    engine.dispose()

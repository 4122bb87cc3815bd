"""A generation run: resampled prompts → synthetic rows, marked, apart from traffic."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.synth.run import SynthError, SynthRequest, split_of, synthesize
from autospec.workloads import SYNTHETIC, domain_prompts


def _rows(engine, target, split: str):  # type: ignore[no-untyped-def]
    t = store.SyntheticTarget(target.info.target_id, target.info.revision, target.dtype_name)
    with store.session_scope(engine, readonly=True) as session:
        return store.select_synthetic(session, target=t, split=split)


def test_resampled_prompts_become_synthetic_rows(db_with_traffic, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    request = SynthRequest(count=20, max_new_tokens=10, batch_size=6, heldout_fraction=0.3)
    seen = []
    outcome = synthesize(request, engine=db_with_traffic, target=tiny,
                         progress=lambda r, done, total: seen.append((done, total)))
    assert seen == [(6, 20), (12, 20), (18, 20), (20, 20)]
    rows = _rows(db_with_traffic, tiny, "train") + _rows(db_with_traffic, tiny, "heldout")
    assert len(rows) == outcome.written == 20
    assert {r.source for r in rows} == {"resampled"}
    logged = {tuple(p) for p, _ in traffic}
    assert all(tuple(r.prompt_ids) in logged and r.origin_request_id for r in rows)
    assert all(0 < len(r.output_ids) <= 10 for r in rows)
    result = outcome.sources[0]
    assert result.heldout == len(_rows(db_with_traffic, tiny, "heldout")) > 0
    for r in rows:  # the split is the prompt's, by its request id
        assert r.split == split_of(f"request:{r.origin_request_id}", 0.3)
    with store.session_scope(db_with_traffic, readonly=True) as session:
        assert store.request_counts(session) == {None: len(traffic)}  # nothing logged


def test_split_is_stable_and_near_the_fraction() -> None:
    keys = [f"request:{i}" for i in range(2000)]
    held = sum(split_of(k, 0.2) == "heldout" for k in keys)
    assert 330 < held < 470
    assert [split_of(k, 0.2) for k in keys] == [split_of(k, 0.2) for k in keys]
    assert all(split_of(k, 0.0) == "train" for k in keys)


@pytest.mark.parametrize(("request_", "message"), [
    (SynthRequest(sources=("domain:poetry",)), "unknown source 'domain:poetry'"),
    (SynthRequest(sources=("traffic",)), "unknown source 'traffic'"),
    (SynthRequest(temperature=0.0), "resampled needs temperature > 0"),
    (SynthRequest(temperature=-0.5), "temperature must be >= 0"),
    (SynthRequest(engine="tgi"), "unknown engine 'tgi'"),
    (SynthRequest(sources=()), "at least one source"),
    (SynthRequest(count=0), "count must be >= 1"),
    (SynthRequest(sources=("domain:coding",)), "has no tokenizer"),
])
def test_bad_requests_name_what_is_wrong(db_with_traffic, tiny, request_, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SynthError, match=message):
        synthesize(request_, engine=db_with_traffic, target=tiny)


def test_nothing_to_resample_is_an_error(sqlite_url, tiny) -> None:  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    with pytest.raises(SynthError, match="no logged prompt to resample"):
        synthesize(SynthRequest(), engine=engine, target=tiny)
    engine.dispose()


def test_domain_prompts_through_the_chat_template(tmp_path, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target
    from tests.controller.helpers import make_tokenizer_model_dir

    target = load_target(str(make_tokenizer_model_dir(tmp_path / "tok")), dtype="float32")
    engine = store.open_store(sqlite_url, upgrade=True)  # no traffic: domains need none
    request = SynthRequest(sources=("domain:coding", "domain:json"), count=4, max_new_tokens=5,
                           batch_size=4, heldout_fraction=0.5)
    outcome = synthesize(request, engine=engine, target=target)
    rows = _rows(engine, target, "train") + _rows(engine, target, "heldout")
    assert outcome.written == len(rows) == 8
    assert outcome.engine == "native"  # auto on a CPU
    assert {r.source for r in rows} == {"domain:coding", "domain:json"}
    assert all(r.origin_request_id is None for r in rows)
    assert "<|im_start|>assistant" in target.tokenizer.decode(rows[0].prompt_ids)
    asked = {tuple(r.prompt_ids) for r in rows}  # the synthetic half, never the traffic one
    for domain in ("coding", "json"):
        synthetic = domain_prompts(domain, 4, seed=request.seed, part=SYNTHETIC)
        assert {tuple(target.encode_chat(c)) for c in synthetic} <= asked
        traffic = domain_prompts(domain, 4, seed=request.seed)
        assert not {tuple(target.encode_chat(c)) for c in traffic} & asked
    engine.dispose()


def test_fewer_than_the_window_resamples_the_newest_prompts(db_with_traffic, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    synthesize(SynthRequest(count=5, max_new_tokens=4, heldout_fraction=0.0),
               engine=db_with_traffic, target=tiny)
    rows = _rows(db_with_traffic, tiny, "train")
    assert sorted(tuple(r.prompt_ids) for r in rows) == sorted(tuple(p) for p, _ in traffic[-5:])


def test_domain_prompts_answered_greedily(tmp_path, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Temperature 0: the domain's prompts answered as greedy traffic would be, twice alike."""
    from autospec.engine.target import load_target
    from tests.controller.helpers import make_tokenizer_model_dir

    target = load_target(str(make_tokenizer_model_dir(tmp_path / "tok")), dtype="float32")
    engine = store.open_store(sqlite_url, upgrade=True)
    request = SynthRequest(sources=("domain:support",), count=4, max_new_tokens=6,
                           batch_size=4, temperature=0.0, heldout_fraction=0.0)
    synthesize(request, engine=engine, target=target)
    synthesize(request, engine=engine, target=target)
    rows = _rows(engine, target, "train")
    assert len(rows) == 8 and all(r.temperature == 0.0 for r in rows)
    first, second = rows[:4], rows[4:]
    assert sorted(r.output_ids for r in first) == sorted(r.output_ids for r in second)
    engine.dispose()

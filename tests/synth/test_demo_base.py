"""The demo's base head (``autospec/demo/base.py``) on the tiny random-init target: found in
the user's store, adopted into the demo's, warm-starting the demo's eagle3 training."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.demo.base import BaseUnavailable, adopt_base, find_base
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate
from tests.synth.test_pretrain import EAGLE, _base


def test_the_newest_base_is_adopted_and_warm_starts_the_demos_eagle3(  # type: ignore[no-untyped-def]
        db_with_traffic, tiny, traffic, sqlite_url, tmp_path) -> None:
    version = _base(db_with_traffic, tiny)
    found = find_base(sqlite_url, tiny)
    assert found is not None and found.version == version
    assert found.meta["base"] is True and found.source == sqlite_url

    demo_url = f"sqlite:///{tmp_path / 'demo.db'}"
    demo = store.open_store(demo_url, upgrade=True)
    from tests.train.conftest import log_traffic

    log_traffic(demo, traffic)
    assert adopt_base(demo, found, tiny) == version
    with store.session_scope(demo, readonly=True) as session:
        row = store.get_speculator(session, version=version)
    assert row.meta["base"] is True and row.meta["adopted_from"] == sqlite_url
    outcome = train_candidate(TrainRequest(kind="eagle3", epochs=1, overrides=EAGLE,
                                           window=WindowSpec(heldout_fraction=0.2)),
                              engine=demo, target=tiny)
    assert outcome.parent == version
    demo.dispose()


def test_no_base_none_and_a_missing_store(db_with_traffic, tiny, sqlite_url,  # type: ignore[no-untyped-def]
                                          tmp_path) -> None:
    assert find_base(sqlite_url, tiny) is None  # traffic, no base head
    assert find_base(sqlite_url, tiny, "none") is None
    missing = tmp_path / "nobody.db"
    assert find_base(f"sqlite:///{missing}", tiny) is None
    assert not missing.exists()  # looking did not create a store


def test_a_named_version_must_be_a_base_eagle3_head(db_with_traffic, tiny,  # type: ignore[no-untyped-def]
                                                    sqlite_url) -> None:
    with pytest.raises(BaseUnavailable, match="'eagle3-nope' is not registered"):
        find_base(sqlite_url, tiny, "eagle3-nope")
    with pytest.raises(BaseUnavailable, match="builtin-ngram is a ngram version, not a base"):
        find_base(sqlite_url, tiny, "builtin-ngram")
    version = _base(db_with_traffic, tiny)
    assert find_base(sqlite_url, tiny, version).version == version


def test_the_demo_refuses_a_named_base_before_it_starts(db_with_traffic, tiny, sqlite_url,  # type: ignore[no-untyped-def]
                                                        monkeypatch) -> None:
    from typer.testing import CliRunner

    from autospec.cli import app
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    get_settings.cache_clear()
    try:
        for name, message in (("eagle3-nope", "is not registered"),
                              ("builtin-ngram", "not a base eagle3 head")):
            result = CliRunner().invoke(app, ["demo", "--base", name, "--out", "/nonexistent/x"])
            assert result.exit_code == 2, result.output
            text = " ".join(result.output.replace("│", " ").split())  # the panel wraps
            assert message in text and "Traceback" not in text
    finally:
        get_settings.cache_clear()


def test_the_hint_builds_on_vllm_where_it_is_installed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    from autospec.demo.base import pretrain_hint

    real = importlib.util.find_spec
    for present in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, present=present: (
            object() if present else None) if name == "vllm" else real(name, *a))
        hint = pretrain_hint("smollm2-135m", "bfloat16")
        assert hint.startswith("autospec pretrain --target smollm2-135m --dtype bfloat16")
        assert hint.endswith(" --engine vllm") is present


def test_a_malformed_store_url_under_base_auto_falls_back_to_scratch() -> None:
    """AUTOSPEC_DATABASE_URL that does not parse: --base auto says no base was read and the
    eagle3 candidates start from scratch, as for any store it cannot read; sqlalchemy's
    ArgumentError had got past that and ended the demo once Ray and Serve were up."""
    from autospec.demo.base import base_for_demo

    said: list[str] = []
    assert base_for_demo(None, None, target_spec="smollm2-135m", wanted="auto",  # type: ignore[arg-type]
                         source_url="not a url", say=said.append) is None
    assert said and "no base head read (malformed database URL" in said[0]

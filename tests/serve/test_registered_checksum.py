"""Issue 16 item 2: loading a registered version checks the artifact's SHA-256 against the
one registered, refuses a mismatch and audits it — wherever a version is loaded (serving,
shadow evaluation, training warm starts), on a tiny random-init target."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autospec import store
from autospec.versions import VersionLoadError, load_speculator_version

from .helpers import promote, register_artifact


def _swap_files(victim: Path, source: Path) -> None:
    """Replace the victim artifact's three files by another valid artifact's."""
    for name in ("config.json", "model.safetensors", "manifest.json"):
        shutil.copyfile(source / name, victim / name)


def _mismatch_events(db) -> list:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return [e for e in store.list_events(session, kinds=["failure"])
                if (e.details or {}).get("what") == "artifact mismatch"]


@pytest.fixture
def poll_interval_s() -> float:
    return 60.0  # the tests swap by hand (versions.poll_once); no watcher racing them


@pytest.fixture
def swapped(db, tiny_llm, tmp_path):  # type: ignore[no-untyped-def]
    """v1 registered, then its files replaced by v2's (both valid suffix artifacts)."""
    v1 = register_artifact(db, tiny_llm, tmp_path, "v1", "suffix")
    v2 = register_artifact(db, tiny_llm, tmp_path, "v2", "suffix", max_match=16)
    _swap_files(v1, v2)
    return v1


def test_serving_refuses_a_replaced_artifact_tiny(server, client, db, swapped) -> None:
    promote(db, "v1")
    assert not server.versions.poll_once()
    assert server.versions.current.name == "builtin-ngram"
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 200 and r.headers["x-autospec-speculator"] == "builtin-ngram"
    (event,) = _mismatch_events(db)  # audited once, by the replica that refused it
    assert event.version == "v1" and event.actor == "test-replica"
    assert "not the registered" in event.reason
    with store.session_scope(db, readonly=True) as session:
        failures = store.list_events(session, kinds=["failure"])
    assert len(failures) == 1  # not a second, generic load-failure event


def test_evaluation_loading_refuses_a_replaced_artifact_tiny(db, tiny_llm, swapped) -> None:
    with pytest.raises(VersionLoadError, match="not the registered"):
        load_speculator_version(db, tiny_llm, "v1", actor="evaluate")
    assert [e.actor for e in _mismatch_events(db)] == ["evaluate"]
    kind, _ = load_speculator_version(db, tiny_llm, "v2")  # the untouched one still loads
    assert kind == "suffix"


def test_a_warm_start_refuses_a_replaced_incumbent_tiny(db, tiny_llm, swapped) -> None:
    from autospec.train.errors import IncumbentMismatch
    from autospec.train.run import _load_incumbent

    with pytest.raises(IncumbentMismatch, match="not the registered"):
        _load_incumbent(db, "v1", tiny_llm, "default")
    assert [e.actor for e in _mismatch_events(db)] == ["train"]

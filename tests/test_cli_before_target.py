"""Cheap refusals come before the target loads (~25 s for the default target the first
time) or Ray starts: every command here is given a target that does not exist, so a check
made after the load would name the target instead of the mistake the test makes.

Before, ``pretrain --domain bogus`` / ``--engine bogus``, ``import --name "bad name!"`` (or a
name already taken), ``train`` on an empty window loaded the target first, and ``serve
--target /nonexistent`` started Ray before anything said the target was missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.ports import free_port
from tests.store.test_registry import register

runner = CliRunner()


@pytest.fixture
def env(tmp_path: Path, sqlite_url: str, monkeypatch) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """A migrated empty store, a data folder and a head directory; the target missing."""
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    store.open_store(sqlite_url, upgrade=True).dispose()
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    return {"head": str(head), "target": str(tmp_path / "no-such-target")}


def _refused(args: list[str], words: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert words in text, result.output
    assert "no-such-target" not in text and "Traceback" not in result.output


@pytest.mark.parametrize(("args", "words"), [
    (["--domain", "bogus"], "unknown domains ['bogus']"),
    (["--engine", "bogus"], "unknown engine 'bogus'"),
    (["--domain", "json", "--domain", "json"], "a source is named twice"),
])
def test_pretrain_checks_its_domains_and_engine_first(env, args, words) -> None:  # type: ignore[no-untyped-def]
    _refused(["pretrain", "--target", env["target"], *args], words)


def test_import_checks_its_name_first(env, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = ["import", env["head"], "--target", env["target"], "--name"]
    _refused([*base, "bad name!"], "invalid version name 'bad name!'")
    engine = store.make_engine(sqlite_url)
    with store.session_scope(engine) as session:
        register(session, tmp_path / "elsewhere", "taken-1")
    engine.dispose()
    _refused([*base, "taken-1"], "speculator version 'taken-1' is already registered")
    (tmp_path / "data" / "artifacts" / "stray").mkdir(parents=True)
    _refused([*base, "stray"], "artifacts/stray already exists")


@pytest.mark.parametrize(("args", "words"), [
    ([], "holds no usable request"),
    (["--segment", "nobody"], "holds no usable request"),
])
def test_train_says_the_window_is_empty_first(env, args, words) -> None:  # type: ignore[no-untyped-def]
    _refused(["train", "--kind", "suffix", "--target", env["target"], *args], words)


def test_serve_checks_its_target_before_ray_starts(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from autospec.serve import cli as serve_cli

    def no_ray(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("Ray started")
    monkeypatch.setattr(serve_cli, "deploy", no_ray)
    monkeypatch.setattr(serve_cli, "shut_down", lambda **kw: None)
    result = runner.invoke(app, ["serve", "--target", env["target"], "--port",
                                 str(free_port())], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert f"Invalid value for --target: target '{env['target']}' is neither" in text, text


def test_import_checks_its_names_form_before_it_creates_a_store(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On a fresh machine (no store yet), a malformed name left a new store behind."""
    from autospec.settings import get_settings

    monkeypatch.delenv("AUTOSPEC_DATABASE_URL", raising=False)
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    try:
        _refused(["import", str(head), "--target", str(tmp_path / "no-such-target"),
                  "--name", "-bad"], "invalid version name '-bad'")
        assert not (tmp_path / "data" / "autospec.db").exists()
    finally:
        get_settings.cache_clear()


def test_import_of_a_file_says_it_is_a_file(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``autospec import head.tar``: it said 'no such directory' of a file that is there."""
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    archive = tmp_path / "head.tar"
    archive.write_bytes(b"x")
    _refused(["import", str(archive)], f"{archive}: a file, not a directory")

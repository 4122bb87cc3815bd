"""Issue 16 item 3: every promotion is undoable, and ``status`` says what replicas serve.

On a fresh store (nothing ever promoted, no cycle ever run) a forced promotion must leave
``builtin-ngram`` as the previous version, so ``rollback`` works, and ``promote
builtin-ngram --force`` works; ``status`` reports the versions the replicas actually serve
(from their reports), beside the pointer. Through the CLI (Typer's runner), with an
in-process replica on a tiny random-init target."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app

from .helpers import make_server, register_artifact

runner = CliRunner()


@pytest.fixture
def cli(sqlite_url, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    return lambda *args: runner.invoke(app, list(args))


def _wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_migrations_register_the_builtin_version(db) -> None:
    with store.session_scope(db, readonly=True) as session:
        row = store.get_speculator(session, version="builtin-ngram")
        assert row.kind == "ngram" and (row.meta or {}).get("builtin") is True


def test_a_forced_first_promotion_on_a_fresh_store_can_be_rolled_back_tiny(
        cli, db, tiny_llm, tmp_path) -> None:
    register_artifact(db, tiny_llm, tmp_path, "x1", "suffix")
    forced = cli("promote", "x1", "--force", "--reason", "first try", "--json")
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["from"] == "builtin-ngram"

    back = cli("rollback", "--json")
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout) | {"reason": None} == {
        "version": "builtin-ngram", "from": "x1", "reason": None, "deployment": "default"}

    again = cli("promote", "x1", "--force", "--reason", "second try")
    assert again.exit_code == 0, again.output
    builtin = cli("promote", "builtin-ngram", "--force", "--reason", "back to the built-in")
    assert builtin.exit_code == 0, builtin.output
    status = json.loads(cli("status", "--json").stdout)
    assert status["live"]["version"] == "builtin-ngram"
    assert status["live"]["previous_version"] == "x1"


def test_status_reports_what_the_replicas_serve_not_only_the_pointer_tiny(
        cli, db, tiny_llm, other_tiny, tmp_path) -> None:
    server = make_server(tiny_llm, db, poll_interval_s=0.05)
    try:
        status = json.loads(cli("status", "--json").stdout)
        assert status["served"] == {"versions": ["builtin-ngram"], "replicas": 1,
                                    "agrees": True}
        (replica,) = status["replicas"]
        assert replica["replica"] == "test-replica" and replica["dtype"] == "float32"
        assert replica["revision"] == tiny_llm.info.revision

        # a version the replica cannot load (built for another target): the pointer moves,
        # the replica stays where it is, and status says so
        register_artifact(db, other_tiny, tmp_path, "y1", "ngram")
        assert cli("promote", "y1", "--force", "--reason", "test").exit_code == 0
        _wait_for(lambda: server.versions.load_failures == 1)
        status = json.loads(cli("status", "--json").stdout)
        assert status["live"]["version"] == "y1"
        assert status["served"] == {"versions": ["builtin-ngram"], "replicas": 1,
                                    "agrees": False}
        table = cli("status")
        assert table.exit_code == 0
        row = " ".join(line for line in table.stdout.splitlines() if "│" in line)
        assert "builtin-ngram (1 replica reporting)" in row and "pointer's y1" in row

        register_artifact(db, tiny_llm, tmp_path, "x1", "suffix")
        assert cli("promote", "x1", "--force", "--reason", "test").exit_code == 0
        _wait_for(lambda: server.versions.current.name == "x1")
        # the replica reports the version it swapped to just after the swap: wait on it
        _wait_for(lambda: json.loads(cli("status", "--json").stdout)["served"]["versions"]
                  == ["x1"])
        status = json.loads(cli("status", "--json").stdout)
        assert status["served"] == {"versions": ["x1"], "replicas": 1, "agrees": True}
    finally:
        server.close()
    status = json.loads(cli("status", "--json").stdout)
    assert status["replicas"] == [] and status["served"]["versions"] == []

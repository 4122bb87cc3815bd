"""What an operator typed or the store holds (a reason, an actor, a policy's name, a name
given on the command line) is printed as written: never read as rich markup (``[/]`` had
been a MarkupError traceback after the pointer moved, and every ``history`` after it one
too; ``see [red]x`` printed ``see x``) nor as an emoji code (``:x:``)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from tests.text import unwrapped

runner = CliRunner()
REASON = "fix [/] tag [red]x :x: C:\\dir\\"  # markup, an emoji code, a trailing backslash


@pytest.fixture
def cli(db, sqlite_url, monkeypatch):  # type: ignore[no-untyped-def]
    import autospec.controller.cli as controller_cli

    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr(controller_cli.out, "width", 400)  # a table's cells not folded
    monkeypatch.setattr(controller_cli.err, "width", 400)
    with store.session_scope(db) as session:
        for version in ("v1", "v2"):
            store.register_speculator(session, version=version, kind="ngram", target_id="t",
                                      artifact_uri=f"/nowhere/{version}", sha256="0" * 64,
                                      verify=False)
    return lambda *args: runner.invoke(app, list(args))


def test_a_reason_with_brackets_is_moved_printed_and_listed_as_written(cli, db) -> None:
    moved = cli("promote", "v1", "--force", "--reason", REASON)
    assert moved.exit_code == 0, moved.output
    assert f"builtin-ngram → v1 ({REASON})" in moved.stdout
    back = cli("rollback", "--reason", "[/]")
    assert back.exit_code == 0 and "v1 → builtin-ngram" in back.stdout
    with store.session_scope(db) as session:
        store.record_event(session, kind="failure", actor="serve:[bold]r1[/]", version="v1",
                           reason="load failed: [/] :x:")
    history = cli("history")
    assert history.exit_code == 0, history.output
    text = unwrapped(history.stdout)
    assert unwrapped(REASON) in text and "[/]" in text and "serve:[bold]r1[/]" in text
    status = cli("status")
    assert status.exit_code == 0, status.output
    assert "load failed: [/] :x:" in status.stdout and "serve:[bold]r1[/]" in status.stdout
    assert REASON in [e["reason"] for e in json.loads(cli("history", "--json").stdout)]


def test_a_policy_name_with_markup_shows_as_written_in_status(cli, tmp_path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text('name: "see [red]x [/]"\n')
    status = cli("status", "--policy", str(policy))
    assert status.exit_code == 0, status.output
    assert "see [red]x [/] from " in status.stdout
    assert "(policy see [red]x [/] needs " in status.stdout


@pytest.mark.parametrize(("args", "code"), [
    (["promote", "v[/]"], 2),  # an unknown version: the error line names it
    (["status", "--deployment", "d[/] :x:"], 2),  # not a name: the usage error names it
    (["ledger", "--deployment", "d[/] :x:"], 2),
    (["history", "--segment", "s[/]"], 2),
])
def test_a_name_typed_with_brackets_is_named_as_typed(cli, args: list[str], code: int) -> None:
    done = cli(*args)
    assert done.exit_code == code, done.output
    assert unwrapped(repr(args[-1])) in unwrapped(done.stderr), done.stderr
    assert "Traceback" not in done.output


"""A ``--deployment`` the store has never heard of is named on stderr, with the closest
known name (a typo would otherwise show an empty status or stage a pointer no replica
follows); a known one, and the default, pass quietly — on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app

runner = CliRunner()


@pytest.fixture
def cli(engine, db_url, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", db_url)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="v1", kind="ngram", target_id="t",
                                  artifact_uri="/nowhere/v1", sha256="0" * 64, verify=False)
        store.set_live(session, version="v1", actor="t", reason="r", deployment="europe")
        store.set_live(session, version="v1", actor="t", reason="r", deployment="asia",
                       segment="json")

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, list(args))

    return invoke


def test_known_deployments_are_those_a_pointer_names(engine, cli) -> None:
    with store.session_scope(engine, readonly=True) as session:
        assert store.known_deployments(session) == ["asia", "europe"]


@pytest.mark.parametrize("command", [["status", "--json"], ["history", "--json"],
                                     ["ledger", "--json"]])
def test_a_typo_is_named_with_the_closest_deployment(cli, command) -> None:
    typo = cli(*command, "--deployment", "eruope")
    assert typo.exit_code == 0, typo.output
    assert "no replica or pointer of this store names deployment 'eruope'" in typo.stderr
    assert "known: asia, default, europe" in typo.stderr
    assert "did you mean 'europe'?" in typo.stderr
    json.loads(typo.stdout)  # --json stays one document
    for quiet in ("europe", "default"):
        known = cli(*command, "--deployment", quiet)
        assert known.exit_code == 0 and "note:" not in known.stderr, known.stderr


def test_a_promotion_to_an_unknown_deployment_is_named_and_still_staged(cli) -> None:
    staged = cli("promote", "v1", "--deployment", "staging", "--force", "--reason", "pre-stage")
    assert staged.exit_code == 0, staged.output
    assert "names deployment 'staging'" in staged.stderr
    again = cli("rollback", "--deployment", "staging")  # now a pointer names it
    assert "note:" not in again.stderr

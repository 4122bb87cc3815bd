"""A ``--deployment`` the store has never heard of is named on stderr, with the closest
known name (a typo would otherwise show an empty status); ``promote`` refuses it (exit 3)
unless ``--new-deployment`` (it started a pointer no replica follows, a note aside); a known
one, and the default, pass quietly — on SQLite and PostgreSQL."""

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
    assert ("no replica, request, pointer, evaluation or event of this store names "
            "deployment 'eruope'") in " ".join(typo.stderr.split())
    assert "known: asia, default, europe" in typo.stderr
    assert "did you mean 'europe'?" in typo.stderr
    json.loads(typo.stdout)  # --json stays one document
    for quiet in ("europe", "default"):
        known = cli(*command, "--deployment", quiet)
        assert known.exit_code == 0 and "note:" not in known.stderr, known.stderr


def test_a_promotion_to_an_unknown_deployment_is_refused_unless_new_is_said(
        engine, cli) -> None:
    """The trial: `promote v1 --deployment <typo> --force` started a live pointer for it
    (exit 0, a note on stderr)."""
    typo = cli("promote", "v1", "--deployment", "eruope", "--force", "--reason", "r", "--json")
    assert typo.exit_code == 3, typo.output
    said = " ".join(typo.stderr.split())
    assert "names deployment 'eruope' (known: asia, default, europe)" in said
    assert "did you mean 'europe'?" in said and "--new-deployment" in said
    assert "note:" not in said  # said once, in the refusal
    assert json.loads(typo.stdout)["outcome"] == "refused"
    with store.session_scope(engine, readonly=True) as session:
        assert store.get_live(session, deployment="eruope") is None  # nothing staged
        assert "eruope" not in store.known_deployments(session)
    staged = cli("promote", "v1", "--deployment", "staging", "--new-deployment", "--force",
                 "--reason", "pre-stage")
    assert staged.exit_code == 0, staged.output
    assert "note:" not in staged.stderr
    again = cli("rollback", "--deployment", "staging")  # now a pointer names it
    assert again.exit_code == 0 and "note:" not in again.stderr
    known = cli("promote", "v1", "--deployment", "europe", "--new-deployment", "--force",
                "--reason", "r")  # said of a known one: nothing to refuse
    assert known.exit_code == 3 and "already live for deployment europe" in known.stderr


def test_rollback_of_an_unknown_deployment_is_refused_and_named(cli) -> None:
    typo = cli("rollback", "--deployment", "eruope")
    assert typo.exit_code == 3
    said = " ".join(typo.stderr.split())
    assert "names deployment 'eruope'" in said and "no previous version" in said


@pytest.mark.parametrize("source", ["traffic", "evaluation", "policy"])
def test_a_deployment_known_by_its_traffic_an_evaluation_or_a_policy_is_known(
        engine, cli, source) -> None:
    """Not only a replica's or a pointer's name: a deployment whose traffic was logged, whose
    traffic an evaluation replayed, or whose controller recorded its policy is promoted to."""
    if source == "traffic":
        store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2],
                                                          deployment="batch")])
    with store.session_scope(engine) as session:
        if source == "evaluation":
            store.record_evaluation(session, candidate="v1", incumbent="builtin-ngram",
                                    decision="reject", deployment="batch")
        elif source == "policy":
            store.record_event(session, kind="policy", actor="t", deployment="batch",
                               reason="controller runs policy 'default'")
    moved = cli("promote", "v1", "--deployment", "batch", "--force", "--reason", "r")
    assert moved.exit_code == 0, moved.output
    assert "note:" not in moved.stderr


def test_an_unknown_deployment_is_refused_before_the_artifact_is_hashed(
        engine, cli, tmp_path, monkeypatch) -> None:
    """Hashing a head of a GB or two takes seconds: a typo was refused only once it was done.
    An unregistered version is still named first (exit 2)."""
    from autospec.controller import operations

    artifact = tmp_path / "v2.safetensors"
    artifact.write_bytes(b"weights")
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="v2", kind="ngram", target_id="t",
                                  artifact_uri=str(artifact), sha256="0" * 64, verify=False)
    hashed: list[object] = []
    monkeypatch.setattr(operations, "artifact_sha256",
                        lambda path: hashed.append(path) or "0" * 64)
    typo = cli("promote", "v2", "--deployment", "eruope", "--force", "--reason", "r")
    assert typo.exit_code == 3 and "names deployment 'eruope'" in " ".join(typo.stderr.split())
    assert hashed == []
    neither = cli("promote", "v9", "--deployment", "eruope", "--force", "--reason", "r")
    assert neither.exit_code == 2 and "'v9' is not registered" in neither.stderr
    moved = cli("promote", "v2", "--deployment", "europe", "--force", "--reason", "r")
    assert moved.exit_code == 0 and hashed == [artifact], moved.output

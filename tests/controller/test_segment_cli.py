"""Operators move segment pointers: ``promote VERSION --segment S`` (passing there: the
version's evaluation has S with Δτ ≥ 0 on at least the gate's min_segment_requests,
whatever the overall decision; else --force),
``rollback --segment S``, ``status`` listing the segment pointers and ``history --segment S``
— on SQLite and PostgreSQL (the ``engine`` fixture)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app

runner = CliRunner()
BUILTIN = "builtin-ngram"


def _segment(delta: float, requests: int = 30) -> dict:
    return {"num_requests": requests, "tau": {"v1": 2.0 + delta, BUILTIN: 2.0},
            "delta": delta, "ci": [delta - 0.1, delta + 0.1]}


@pytest.fixture
def cli(engine, db_url, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", db_url)
    with store.session_scope(engine) as session:
        for version in ("v1", "v2"):
            store.register_speculator(session, version=version, kind="ngram", target_id="t",
                                      artifact_uri=f"/nowhere/{version}", sha256="0" * 64,
                                      verify=False)
        # overall a rejection: alpha gained, beta lost
        store.record_evaluation(session, candidate="v1", incumbent=BUILTIN, decision="reject",
                                reasons=["segment 'beta' regressed"], num_requests=60,
                                tau_candidate=2.1, tau_incumbent=2.05,
                                per_segment={"segments": {"alpha": _segment(0.4),
                                                          "beta": _segment(-0.2),
                                                          "delta": _segment(0.9, 3)}})

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, list(args))

    return invoke


def test_a_version_the_gate_rejected_for_the_deployment_may_serve_a_segment_it_won(
        cli, engine) -> None:
    """As a cycle marks it when it loses overall (beta regressed) — alpha's own evidence
    still promotes it there; the deployment's pointer needs --force."""
    with store.session_scope(engine) as session:
        store.set_state(session, version="v1", state="rejected", actor="controller",
                        reason="segment 'beta' regressed")
    whole = cli("promote", "v1")
    assert whole.exit_code == 3 and "decided reject" in whole.output
    with store.session_scope(engine) as session, pytest.raises(store.Conflict, match="--force"):
        store.set_live(session, version="v1", actor="t", reason="r")
    moved = cli("promote", "v1", "--segment", "alpha")
    assert moved.exit_code == 0, moved.output
    with store.session_scope(engine, readonly=True) as session:
        assert store.serving_version(session, segment="alpha") == "v1"
        assert store.serving_version(session) == BUILTIN


def test_promote_and_rollback_a_segment(cli) -> None:
    moved = cli("promote", "v1", "--segment", "alpha", "--json")
    assert moved.exit_code == 0, moved.output
    data = json.loads(moved.stdout)
    assert (data["kind"], data["from"], data["segment"]) == ("promotion", BUILTIN, "alpha")
    assert "on segment alpha" in data["reason"]
    again = cli("promote", "v1", "--segment", "alpha")
    assert again.exit_code == 3 and "already live" in again.output

    lost = cli("promote", "v1", "--segment", "beta")  # Δτ < 0 there
    assert lost.exit_code == 3 and "-0.200" in lost.output and "--force" in lost.output
    whole = cli("promote", "v1")  # the deployment's gate decided reject
    assert whole.exit_code == 3 and "decided reject" in whole.output
    few = cli("promote", "v1", "--segment", "delta")  # a gain, on 3 requests: not judged
    assert few.exit_code == 3 and "+0.900 on 3 of its requests" in few.output
    assert "on at least 10" in few.output
    unseen = cli("promote", "v1", "--segment", "gamma")
    assert unseen.exit_code == 3 and "no requests of it" in unseen.output
    untested = cli("promote", "v2", "--segment", "beta")
    assert untested.exit_code == 3 and "no evaluation" in untested.output
    forced = cli("promote", "v2", "--segment", "beta", "--force", "--reason", "pin", "--json")
    assert forced.exit_code == 0 and json.loads(forced.stdout)["kind"] == "override"
    bad = cli("promote", "v2", "--segment", "a b", "--force", "--reason", "x")
    assert bad.exit_code == 2 and "invalid segment" in bad.output

    back = cli("rollback", "--segment", "alpha", "--json")
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout) | {"reason": ""} == {
        "version": BUILTIN, "from": "v1", "reason": "", "deployment": "default",
        "segment": "alpha"}
    none = cli("rollback", "--segment", "gamma")
    assert none.exit_code == 3 and "segment gamma" in none.output


def test_a_segment_nothing_in_the_store_names_is_noted_and_the_move_goes_on(cli) -> None:
    """As ``history --segment`` and an unknown ``--deployment``: a note on stderr, and the
    move is made (a new segment's pointer may be staged before its traffic comes); it had
    been silent. A segment an evaluation of the version judged is known, its requests
    purged or not."""
    judged = cli("promote", "v1", "--segment", "alpha")  # no request logged: the evaluation
    assert judged.exit_code == 0 and "names segment" not in judged.stderr
    new = cli("promote", "v2", "--force", "--reason", "r", "--segment", "newseg")
    assert new.exit_code == 0, new.output
    assert ("no logged request, no pointer of deployment 'default' and no evaluation of v2 "
            "names segment 'newseg'") in " ".join(new.stderr.split())
    assert "override (segment newseg): builtin-ngram → v2 (r)" in new.stdout
    again = cli("rollback", "--segment", "newseg")  # its pointer now
    assert again.exit_code == 0 and "names segment" not in again.stderr
    typo = cli("rollback", "--segment", "nwseg")
    assert typo.exit_code == 3 and "names segment 'nwseg'" in " ".join(typo.stderr.split())


def test_promoting_a_segment_to_the_version_that_drafts_it_is_refused_not_an_error(
        cli, engine) -> None:
    """The segment follows the deployment's pointer: a refusal (exit 3) that says so, and no
    pointer is created (it was a store conflict, exit 2)."""
    assert cli("promote", "v1", "--force", "--reason", "whole").exit_code == 0
    same = cli("promote", "v1", "--segment", "alpha", "--force", "--reason", "pin")
    assert same.exit_code == 3, same.output
    assert "already drafts segment alpha" in same.output and "nothing to move" in same.output
    with store.session_scope(engine, readonly=True) as session:
        assert store.get_live(session, segment="alpha") is None


def test_status_lists_segment_pointers_and_history_filters_by_segment(cli) -> None:
    assert cli("promote", "v1", "--segment", "alpha").exit_code == 0
    assert cli("promote", "v2", "--segment", "beta", "--force", "--reason", "pin").exit_code == 0
    status = json.loads(cli("status", "--json").stdout)
    assert status["live"]["version"] == BUILTIN  # the deployment's pointer did not move
    assert [(s["segment"], s["version"], s["previous_version"]) for s in status["segments"]] \
        == [("alpha", "v1", BUILTIN), ("beta", "v2", BUILTIN)]
    assert all(s["since"] for s in status["segments"])
    table = cli("status")
    assert table.exit_code == 0 and "segment pointers" in table.stdout
    assert "alpha" in table.stdout and "v2" in table.stdout

    alpha = json.loads(cli("history", "--segment", "alpha", "--json").stdout)
    assert [(r["event"], r["version"], r["segment"]) for r in alpha] == [
        ("promotion", "v1", "alpha"), ("promotion", BUILTIN, "alpha")]  # then its pinning
    details = alpha[0]["details"]  # the segment's τ: what its canary compares live τ with
    assert details["shadow_tau"] == pytest.approx(2.4) and details["incumbent"] == BUILTIN
    assert details["incumbent_shadow_tau"] == pytest.approx(2.0) and details["requests"] == 30
    beta = json.loads(cli("history", "--segment", "beta", "--json").stdout)
    assert [r["event"] for r in beta] == ["override", "promotion"]
    everything = cli("history")
    assert everything.exit_code == 0 and "[beta]" in everything.stdout
    assert "names segment" not in cli("history", "--segment", "alpha").stderr
    typo = cli("history", "--segment", "alhpa", "--json")  # a note on stderr, JSON untouched
    assert typo.exit_code == 0 and json.loads(typo.stdout) == []
    assert "no logged request and no pointer of deployment 'default' names segment 'alhpa'" \
        in " ".join(typo.stderr.split())


def test_history_finds_a_deployments_events_behind_newer_ones_of_others(cli, engine) -> None:
    """Filtered in SQL and paged: 250 newer events of another deployment (in segment alpha
    too) and 210 newer cycle_start notes (not shown) hid every event of ``default``."""
    assert cli("promote", "v1", "--segment", "alpha").exit_code == 0
    with store.session_scope(engine) as session:
        store.record_event(session, kind="failure", actor="t", reason="global")
        for i in range(250):
            store.record_event(session, kind="failure", actor="t", reason=f"other {i}",
                               deployment="other", details={"segment": "alpha"})
        for _ in range(210):
            store.record_event(session, kind="note", actor="t", deployment="default",
                               details={"type": "cycle_start", "segment": "alpha"})
    latest = json.loads(cli("history", "--limit", "2", "--json").stdout)
    assert [(r["event"], r["version"]) for r in latest] == [("failure", None), ("promotion", "v1")]
    assert latest[0]["reason"] == "global"
    alpha = json.loads(cli("history", "--segment", "alpha", "--limit", "2", "--json").stdout)
    assert [(r["event"], r["version"]) for r in alpha] == [("promotion", "v1"),
                                                           ("promotion", BUILTIN)]


def test_unpin_drops_a_segments_pointer_and_the_deployments_version_drafts_it(cli,
                                                                               engine) -> None:
    assert cli("promote", "v1", "--segment", "alpha").exit_code == 0
    unpinned = cli("rollback", "--segment", "alpha", "--unpin", "--reason", "done", "--json")
    assert unpinned.exit_code == 0, unpinned.output
    assert json.loads(unpinned.stdout) == {
        "version": BUILTIN, "from": "v1", "reason": "done", "deployment": "default",
        "segment": "alpha", "unpinned": True}
    with store.session_scope(engine, readonly=True) as session:
        assert store.list_segment_pointers(session, deployment="default") == []
        assert store.serving_version(session, segment="alpha") == BUILTIN
        assert store.get_speculator(session, version="v1").state == "retired"
    history = json.loads(cli("history", "--segment", "alpha", "--json").stdout)
    assert history[0]["event"] == "unpin" and history[0]["version"] == BUILTIN
    again = cli("rollback", "--segment", "alpha", "--unpin")
    assert again.exit_code == 3 and "no pointer of its own" in again.output
    whole = cli("rollback", "--unpin")
    assert whole.exit_code == 2 and "--segment" in whole.output


def test_unpin_keeps_a_version_live_that_another_pointer_names(cli, engine) -> None:
    assert cli("promote", "v1", "--segment", "alpha").exit_code == 0
    assert cli("promote", "v1", "--segment", "beta", "--force", "--reason", "x").exit_code == 0
    assert cli("rollback", "--segment", "alpha", "--unpin").exit_code == 0
    with store.session_scope(engine, readonly=True) as session:
        assert [p.segment for p in store.list_segment_pointers(session, deployment="default")] \
            == ["beta"]
        assert store.get_speculator(session, version="v1").state == "live"


def test_a_vllm_deployment_refuses_a_segment_pointer_and_says_why(cli, engine) -> None:
    with store.session_scope(engine) as session:
        store.record_deployment(session, name="default", target="t", target_id="t",
                                target_revision="r", dtype="float32", actor="replica",
                                engine="vllm")
    refused = cli("promote", "v1", "--segment", "alpha")
    assert refused.exit_code == 3, refused.output
    assert "serves on vLLM" in refused.output and "--engine native" in refused.output
    assert "the segment's v1 is of kind ngram" in " ".join(refused.output.split())
    forced = cli("promote", "v2", "--segment", "beta", "--force", "--reason", "pin")
    assert forced.exit_code == 3  # --force overrides the evidence, not what replicas can do
    assert cli("promote", "v1", "--force", "--reason", "whole").exit_code == 0
    with store.session_scope(engine, readonly=True) as session:
        assert store.list_segment_pointers(session, deployment="default") == []


def test_a_vllm_deployment_takes_a_suffix_segment_pointer_beside_a_suffix_deployment(
        cli, engine) -> None:
    """Its replicas hold a segment's suffix version in a slot of the engine's proposer."""
    with store.session_scope(engine) as session:
        for version in ("idx-dep", "idx-seg"):
            store.register_speculator(session, version=version, kind="suffix", target_id="t",
                                      artifact_uri=f"/nowhere/{version}", sha256="0" * 64,
                                      verify=False)
        store.record_deployment(session, name="default", target="t", target_id="t",
                                target_revision="r", dtype="float32", actor="replica",
                                engine="vllm")
    assert cli("promote", "idx-seg", "--segment", "alpha", "--force", "--reason",
               "pin").exit_code == 3  # the deployment's version is builtin-ngram
    assert cli("promote", "idx-dep", "--force", "--reason", "whole").exit_code == 0
    moved = cli("promote", "idx-seg", "--segment", "alpha", "--force", "--reason", "pin")
    assert moved.exit_code == 0, moved.output
    with store.session_scope(engine, readonly=True) as session:
        assert store.serving_version(session, segment="alpha") == "idx-seg"
    status = json.loads(cli("status", "--json").stdout)
    assert [(s["segment"], s["refused"]) for s in status["segments"]] == [("alpha", None)]
    # the deployment's version moves to another kind: its engine has no proposer to hold
    # alpha's index, and status says so for the pointer that stays
    assert cli("promote", "v1", "--force", "--reason", "whole").exit_code == 0
    status = json.loads(cli("status", "--json").stdout)
    why = " ".join(status["segments"][0]["refused"].split())
    assert "serves on vLLM" in why and "the deployment's v1 is of kind ngram" in why


def test_status_says_when_replicas_refused_a_segments_version(cli, engine) -> None:
    """A replica that cannot load a segment's version (checksum, missing file) records a
    ``failure`` naming the segment; ``status`` shows that segment as not drafted by its
    pointer's version, with the replica's reason, until the pointer moves again."""
    assert cli("promote", "v1", "--segment", "alpha").exit_code == 0
    assert cli("promote", "v2", "--segment", "beta", "--force", "--reason", "pin").exit_code == 0
    with store.session_scope(engine) as session:
        store.record_event(session, kind="failure", actor="replica-7",
                           reason="version 'v2': model.safetensors: sha256 mismatch",
                           deployment="default", version="v2",
                           details={"what": "speculator load", "segment": "beta"})
        store.record_event(session, kind="failure", actor="replica-7", reason="elsewhere",
                           deployment="default", version="v1",
                           details={"what": "speculator load", "segment": "gamma"})
    status = json.loads(cli("status", "--json").stdout)
    refused = {s["segment"]: s["refused"] for s in status["segments"]}
    assert refused["alpha"] is None
    assert refused["beta"] == "replica-7: version 'v2': model.safetensors: sha256 mismatch"
    table = cli("status")
    assert table.exit_code == 0 and "drafted by it" in table.stdout and "no —" in table.stdout
    # the pointer moves on: the old refusal no longer speaks for it
    assert cli("rollback", "--segment", "beta").exit_code == 0
    status = json.loads(cli("status", "--json").stdout)
    assert {s["segment"]: s["refused"] for s in status["segments"]}["beta"] is None


def test_an_evaluation_of_one_deployments_traffic_is_no_evidence_for_another(cli, engine) -> None:
    """Evaluations name the deployment whose traffic they replayed (revision 0009); those
    recorded before (NULL, as the fixture's) count for every deployment, as they did."""
    with store.session_scope(engine) as session:
        store.record_evaluation(session, candidate="v2", incumbent=BUILTIN, decision="promote",
                                num_requests=60, tau_candidate=2.5, tau_incumbent=2.0,
                                deployment="east")
    west = cli("promote", "v2", "--deployment", "west", "--new-deployment")
    assert west.exit_code == 3 and "no evaluation against" in west.output, west.output
    east = cli("promote", "v2", "--deployment", "east", "--json")
    assert east.exit_code == 0, east.output
    with store.session_scope(engine, readonly=True) as session:
        (ev,) = store.list_evaluations(session, candidate="v2", deployment="east")
        assert ev.deployment == "east"
        assert store.list_evaluations(session, candidate="v2", deployment="west") == []
        assert len(store.list_evaluations(session, candidate="v1", deployment="west")) == 1

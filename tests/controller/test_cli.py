"""Operator CLI: status, promote (gated; --force --reason audited), rollback, versions,
history and ``controller once`` — JSON output and exit codes scripts can rely on."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from tests.text import unwrapped

from .helpers import T0, events, live_version, log_traffic, write_policy

runner = CliRunner()


@pytest.fixture
def cli(db, sqlite_url, tiny, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr("autospec.engine.target.load_target", lambda *a, **k: tiny)
    policy = write_policy(tmp_path / "policy.yaml")
    rejecting = tmp_path / "rejecting.yaml"
    rejecting.write_text(policy.read_text().replace("min_gain: 0.05", "min_gain: 50"))

    def invoke(*args: str, policy_file=policy):  # type: ignore[no-untyped-def]
        extra = ["--policy", str(policy_file)] if args[0] in ("controller", "status") else []
        return runner.invoke(app, [*args, *extra])

    invoke.rejecting = rejecting  # type: ignore[attr-defined]
    return invoke


def test_controller_once_exit_codes_and_status(cli, db, traffic, caplog) -> None:
    log_traffic(db, traffic)
    with caplog.at_level("INFO", logger="autospec.controller.cycle"):
        rejected = cli("controller", "once", "--json", policy_file=cli.rejecting)
    assert rejected.exit_code == 3, rejected.output
    assert json.loads(rejected.stdout)["outcome"] == "rejected"
    progress = [r.getMessage() for r in caplog.records]  # a cycle says what it is doing
    assert any(" candidate: training on " in m for m in progress), progress
    assert any(" candidate: " in m and " trained in " in m for m in progress), progress
    assert any(": evaluating against " in m and " held-out requests" in m for m in progress)
    assert any(" fails the gate (τ " in m for m in progress)
    log_traffic(db, traffic, start=T0 + timedelta(minutes=10))  # a fresh window
    promoted = cli("controller", "once", "--json")
    assert promoted.exit_code == 0, promoted.output
    data = json.loads(promoted.stdout)
    assert data["outcome"] == "promoted" and live_version(db) == data["promoted"]
    again = cli("controller", "once", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["outcome"] == "nothing_to_do"

    status = json.loads(cli("status", "--json").stdout)
    assert status["live"]["version"] == data["promoted"]
    assert status["live"]["previous_version"] == "builtin-ngram"
    assert status["tau"]["shadow"] > 1 and status["fresh_requests"] == 0
    assert [c["outcome"] for c in status["cycles"]] == ["promoted", "rejected"]
    assert status["cycles"][1]["reasons"] and status["lease"] is None
    assert status["traffic"]["total"] == 2 * len(traffic)
    assert status["canary"]["version"] == data["promoted"]
    assert status["canary"]["expected_speed_gain"] > 0
    speed = status["speedup"]  # estimated and measured side by side
    assert speed["basis"] == "measured" and speed["measured"] > 0 and speed["estimated"] > 0
    table = cli("status")
    assert table.exit_code == 0 and data["promoted"][:12] in table.stdout
    assert "speedup est. / measured" in table.stdout
    assert f"{speed['estimated']:.2f}× / {speed['measured']:.2f}×" in table.stdout


def test_promote_needs_a_passing_evaluation_or_an_audited_override(cli, db, traffic) -> None:
    log_traffic(db, traffic)
    once = cli("controller", "once", "--json", policy_file=cli.rejecting)
    candidate = json.loads(once.stdout)["candidates"][0]

    refused = cli("promote", candidate)
    assert refused.exit_code == 3 and "decided reject" in refused.output
    assert "--force" in refused.output and "Traceback" not in refused.output
    no_reason = cli("promote", candidate, "--force")
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    unknown = cli("promote", "no-such-version")
    assert unknown.exit_code == 2 and "not registered" in unknown.output

    forced = cli("promote", candidate, "--force", "--reason", "hotfix for ticket 42", "--json")
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["kind"] == "override" and live_version(db) == candidate
    (override,) = events(db, "override")
    assert override.reason == "hotfix for ticket 42" and override.actor.startswith("cli")

    back = cli("rollback", "--json")
    assert back.exit_code == 0 and json.loads(back.stdout)["version"] == "builtin-ngram"
    assert live_version(db) == "builtin-ngram"

    versions = json.loads(cli("versions", "--json").stdout)
    row = next(v for v in versions if v["version"] == candidate)
    assert row["state"] == "rolled_back" and row["evaluation"]["decision"] == "reject"
    history = json.loads(cli("history", "--json").stdout)
    kinds = [h["event"] for h in history]
    assert {"rollback", "override", "rejection", "cycle rejected"} <= set(kinds)
    assert "policy" in kinds  # the policy each controller ran, as docs/configuration.md says
    assert cli("versions").exit_code == 0 and cli("history").exit_code == 0


def test_rollback_with_nothing_to_roll_back_is_refused(cli) -> None:
    result = cli("rollback")
    assert result.exit_code == 3 and "no previous version" in result.output


def test_a_store_error_is_one_line_and_exit_2(monkeypatch) -> None:
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", "sqlite:////nonexistent-dir/x/y.db")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_controller_address_joins_that_ray_cluster_when_the_policy_uses_ray_train(
        cli, tmp_path, monkeypatch) -> None:
    joined: list[tuple[str | None, int]] = []
    monkeypatch.setattr("autospec.train.ray_trainer.connect_ray",
                        lambda *, address=None, workers=2: joined.append((address, workers)))
    ray_policy = write_policy(tmp_path / "ray.yaml", (tmp_path / "policy.yaml").read_text()
                              .replace("min_train_requests: 5", "min_train_requests: 5, "
                                       "workers: 2"))
    done = cli("controller", "once", "--address", "10.0.0.7:6379", "--json",
               policy_file=ray_policy)
    assert done.exit_code == 0, done.output  # an empty store: nothing to do
    assert joined == [("10.0.0.7:6379", 2)]
    in_process = cli("controller", "once", "--address", "10.0.0.7:6379")
    assert in_process.exit_code == 0 and "--address is not used" in in_process.output
    assert joined == [("10.0.0.7:6379", 2)]


def test_status_reads_the_policy_the_controller_runs(cli, db) -> None:
    from autospec import store

    before = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    assert before["policy_in_force"]["origin"] == "shipped-default"
    assert before["policy"] == "default"
    for _ in range(2):  # the same text twice: recorded once
        done = cli("controller", "once", "--json", policy_file=cli.rejecting)
        assert done.exit_code == 0, done.output  # nothing to do: no traffic yet
    after = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    info = after["policy_in_force"]
    assert info["origin"] == "recorded" and info["source"] == str(cli.rejecting)
    assert info["recorded_by"] and after["policy"] != "default"
    with store.session_scope(db, readonly=True) as session:
        recorded = store.list_events(session, kinds=["policy"])
    assert len(recorded) == 1 and "min_gain: 50" in recorded[0].details["text"]
    given = json.loads(runner.invoke(app, ["status", "--json", "--policy", "default"]).stdout)
    assert given["policy_in_force"]["origin"] == "given" and given["policy"] == "default"
    import autospec.controller.cli as controller_cli  # its console read COLUMNS when made

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controller_cli.out, "width", 300)
        table = runner.invoke(app, ["status"])
    assert table.exit_code == 0 and str(cli.rejecting) in unwrapped(table.stdout)


def test_controller_deployment_overrides_the_policys(cli, db, traffic) -> None:
    """``controller once --deployment B`` trains on B's traffic and moves B's pointer, as a
    policy naming B would; the default deployment's pointer and policy are untouched."""
    from autospec import store

    log_traffic(db, traffic, deployment="b")
    done = cli("controller", "once", "--json", "--deployment", "b")
    assert done.exit_code == 0, done.output
    promoted = json.loads(done.stdout)["promoted"]
    with store.session_scope(db, readonly=True) as session:
        assert store.get_live(session, deployment="b").version == promoted
        assert store.get_live(session) is None
        recorded = store.list_events(session, kinds=["policy"])
    assert [e.deployment for e in recorded] == ["b"]
    assert "--deployment" in recorded[0].details["source"]
    status = json.loads(runner.invoke(app, ["status", "--json", "--deployment", "b"]).stdout)
    assert status["live"]["version"] == promoted
    unknown = cli("controller", "once", "--json", "--deployment", "bb")  # a typo: a note
    assert unknown.exit_code == 0 and "did you mean 'b'" in unknown.stderr, unknown.output
    assert json.loads(unknown.stdout)["outcome"] == "nothing_to_do"


def test_an_unknown_log_level_is_a_usage_error(cli) -> None:
    bad = cli("controller", "once", "--log-level", "LOUD")
    assert bad.exit_code == 2 and "--log-level" in bad.output and "LOUD" in bad.output
    assert "Traceback" not in bad.output


def test_history_shows_the_replicas_swaps_and_imports(cli, db) -> None:
    """docs/vllm.md audits every swap (`new engine` or `in-place`) and an import in
    `autospec history`; the history left both kinds out until 2026-12-05."""
    from autospec import store

    with store.session_scope(db) as session:
        store.record_event(session, kind="swap", actor="serve:r1", version="suffix-1",
                           reason="vLLM method ngram -> custom_class (another kind)",
                           details={"mode": "new engine", "seconds": 15.0})
        store.record_event(session, kind="import", actor="cli:op", version="head-1",
                           reason="imported a speculators-format head")
    rows = json.loads(cli("history", "--json").stdout)
    swap = next(r for r in rows if r["event"] == "swap")
    assert swap["version"] == "suffix-1" and swap["details"]["mode"] == "new engine"
    assert any(r["event"] == "import" and r["version"] == "head-1" for r in rows)
    assert "swap" in cli("history").stdout


def test_every_operator_command_takes_database_url_as_the_db_commands_do(
        db, sqlite_url, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No AUTOSPEC_DATABASE_URL: ``--database-url`` names the store, and the data dir's
    default SQLite file is neither read nor created."""
    import typer

    from autospec import store
    from tests.store.test_registry import register

    monkeypatch.delenv("AUTOSPEC_DATABASE_URL", raising=False)
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "elsewhere"))
    with store.session_scope(db) as s:
        register(s, tmp_path, "v1")
    url = ["--database-url", sqlite_url]
    moved = runner.invoke(app, ["promote", "v1", "--force", "--reason", "r", "--json", *url])
    assert moved.exit_code == 0, moved.output
    status = runner.invoke(app, ["status", "--json", *url])
    assert json.loads(status.stdout)["live"]["version"] == "v1"
    for args in (["history"], ["versions"], ["ledger"], ["versions", "prune", "--dry-run"],
                 ["rollback"]):
        assert runner.invoke(app, [*args, *url]).exit_code == 0, args
    assert live_version(db) == "builtin-ngram"
    assert not (tmp_path / "elsewhere").exists()
    root = typer.main.get_command(app)
    for path in (["evaluate"], ["controller", "once"], ["controller", "watch"],
                 ["controller", "run"]):
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        assert "--database-url" in {o for p in command.params for o in p.opts}, path


@pytest.mark.parametrize("damage", ["a byte flipped", "cut short", "deleted", "gone"])
def test_promote_refuses_an_artifact_that_fails_its_sha256_even_forced(
        cli, db, tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    """Tampered after it was stored: promote --force moved the pointer (exit 0) to a version
    no replica would load. An artifact whose folder this machine lacks (the operator CLI
    where the shared storage is not mounted) is not checked."""
    import shutil

    from autospec import store

    art = tmp_path / "artifacts" / "v-tampered"
    art.mkdir(parents=True)
    (art / "config.json").write_text("{}")
    (art / "model.safetensors").write_bytes(b"weights" * 100)
    (tmp_path / "artifacts" / "v-other").mkdir()  # the folder holds more than v-tampered
    with store.session_scope(db) as session:
        store.register_speculator(session, version="v-tampered", kind="ngram", target_id="t",
                                  artifact_uri=str(art), sha256=store.write_manifest(art))
        store.register_speculator(session, version="v-elsewhere", kind="ngram", target_id="t",
                                  artifact_uri="/not/mounted/here/v-elsewhere", sha256="0" * 64,
                                  verify=False)
    weights = art / "model.safetensors"
    if damage == "a byte flipped":
        weights.write_bytes(b"weights" * 99 + b"weighTs")
    elif damage == "cut short":
        weights.write_bytes(b"weights")
    elif damage == "deleted":
        weights.unlink()
    else:
        shutil.rmtree(art)
    refused = cli("promote", "v-tampered", "--force", "--reason", "hotfix")
    assert refused.exit_code == 3 and "Traceback" not in refused.output, refused.output
    said = unwrapped(refused.output)
    assert unwrapped("not promoting v-tampered: its artifact fails its checks") in said
    assert unwrapped("no replica would load it") in said
    assert live_version(db) != "v-tampered"
    moved = cli("promote", "v-elsewhere", "--force", "--reason", "hotfix")
    assert moved.exit_code == 0 and live_version(db) == "v-elsewhere", moved.output


def test_promote_hashes_the_artifact_outside_the_write_lock(
        db, sqlite_url, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An eagle3 head for an 8B target is 1-2 GB: hashing it takes seconds. promote hashed it
    inside its write transaction, which on SQLite holds the write lock (BEGIN IMMEDIATE), so
    every replica's request log waited on it (and failed past the busy timeout)."""
    from sqlalchemy import text

    from autospec import store
    from autospec.controller import operations
    from autospec.store.db import writer_engine

    art = tmp_path / "artifacts" / "v-big"
    art.mkdir(parents=True)
    (art / "config.json").write_text("{}")
    with store.session_scope(db) as session:
        store.register_speculator(session, version="v-big", kind="ngram", target_id="t",
                                  artifact_uri=str(art), sha256=store.write_manifest(art))
    other = store.make_engine(sqlite_url, busy_timeout_s=0.2)  # a replica's traffic writer
    wrote: list[bool] = []

    def hashing(path):  # type: ignore[no-untyped-def]
        with writer_engine(other).begin() as conn:  # raises if the lock is held
            conn.execute(text("SELECT 1"))
            wrote.append(True)
        return store.artifact_sha256(path)

    monkeypatch.setattr(operations, "artifact_sha256", hashing)
    operations.promote_version(db, version="v-big", actor="t", force=True, reason="r")
    other.dispose()
    assert wrote == [True]
    assert live_version(db) == "v-big"


def test_promote_does_not_check_an_artifact_below_an_empty_mount_point(
        cli, db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The operator CLI where the shared artifact storage is not mounted: its mount point is
    an empty directory. 959990c checked the artifact wherever its folder was a directory and
    refused (exit 3, --force too) a version the replicas load from the mounted storage."""
    from autospec import store

    mount_point = tmp_path / "mnt" / "artifacts"
    mount_point.mkdir(parents=True)
    with store.session_scope(db) as session:
        store.register_speculator(session, version="v-shared", kind="ngram", target_id="t",
                                  artifact_uri=str(mount_point / "v-shared"),
                                  sha256="0" * 64, verify=False)
    moved = cli("promote", "v-shared", "--force", "--reason", "hotfix")
    assert moved.exit_code == 0 and live_version(db) == "v-shared", moved.output

"""A controller killed (SIGKILL) between registering a candidate and promoting it, or
between moving the pointer and recording the cycle, leaves the store consistent: ``status``
agrees with what a replica serves, the dead holder's lease expires, and the next run
closes the dead cycle and completes cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.controller.cycle import Controller
from autospec.serve.versions import VersionManager

from .helpers import events, fast_policy, live_version, log_traffic, write_policy

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.controller.crash_worker"  # run as a module from ROOT: it imports tests.tiny


def _status(monkeypatch: pytest.MonkeyPatch, url: str, policy: Path) -> dict:
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", url)
    result = CliRunner().invoke(app, ["status", "--json", "--policy", str(policy)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _served(db, tiny) -> str:  # type: ignore[no-untyped-def]
    replica = VersionManager(target=tiny, db=db, k=4, poll_interval_s=60)
    replica.poll_once()
    return replica.current.name


def _assert_the_dead_holders_lease_is_kept(db, status: dict) -> None:  # type: ignore[no-untyped-def]
    """The dead holder's lease row stays (others wait on it); ``status`` shows it while it is
    unexpired. The 4 s TTL can run out while a loaded machine reaps the worker and runs
    ``status``, so the row is read from the store rather than from ``status``."""
    from autospec.controller import records
    from autospec.store.models import utcnow

    with store.session_scope(db, readonly=True) as session:
        row = store.get_lease(session, name=records.lease_name("default"))
        assert row is not None and row.holder
        unexpired = row.expires_at > utcnow()
    assert (status["lease"] is not None) or not unexpired
    if status["lease"] is not None:
        assert status["lease"]["holder"] == row.holder


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["registered", "promoted"])
def test_a_killed_controller_leaves_a_consistent_store(
        stage, db, sqlite_url, tiny, traffic, tmp_path, monkeypatch) -> None:
    log_traffic(db, traffic)
    policy_file = write_policy(tmp_path / "policy.yaml")
    proc = subprocess.run([sys.executable, "-m", WORKER, sqlite_url, str(policy_file), stage],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ),
                          cwd=ROOT)
    assert proc.returncode == -9 and f"reached {stage}" in proc.stdout, proc.stderr[-2000:]

    with store.session_scope(db, readonly=True) as session:
        (orphan,) = store.list_speculators(session, kind="suffix")
        assert orphan.state == "candidate"  # registered, never live
    assert live_version(db) is None  # the pointer move died with its transaction
    status = _status(monkeypatch, sqlite_url, policy_file)
    assert status["live"]["version"] == _served(db, tiny) == "builtin-ngram"
    _assert_the_dead_holders_lease_is_kept(db, status)
    assert status["cycles"][0]["outcome"] == "running"

    controller = Controller(db, fast_policy(), tiny)
    deadline = time.monotonic() + 30
    while (result := controller.run_cycle()).outcome == "busy":
        assert time.monotonic() < deadline, "the dead controller's lease never expired"
        time.sleep(0.5)
    assert result.outcome == "promoted", result.reasons
    assert result.promoted != orphan.version

    (failure,) = [e for e in events(db, "failure") if (e.details or {}).get("type") == "cycle"]
    assert "did not finish" in failure.reason and orphan.version in failure.reason
    status = _status(monkeypatch, sqlite_url, policy_file)
    assert status["live"]["version"] == _served(db, tiny) == result.promoted
    assert [c["outcome"] for c in status["cycles"][:2]] == ["promoted", "interrupted"]
    assert status["lease"] is None
    assert controller.run_cycle().outcome == "nothing_to_do"

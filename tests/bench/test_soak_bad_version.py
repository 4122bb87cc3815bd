"""The soak's "corrupt version pointed live by hand" against a real store and the real
``promote`` / ``rollback``, the replicas faked: since 959990c ``promote --force`` refuses a
version whose artifact fails its SHA-256 (exit 3), so the fault, which counted on promote
moving the pointer, waited for a replica refusal until the soak's deadline and failed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.bench.soak import faults
from autospec.bench.soak.storeview import StoreView
from autospec.cli import app


class _View(StoreView):
    """The store as the fault reads it; a replica refuses the corrupt version once live."""

    def events(self, after_id: int = 0) -> list[dict[str, Any]]:
        found = super().events(after_id)
        live = self.live() or ""
        if live.startswith("soak-corrupt-"):
            found.append({"id": 10**9, "at": time.time(), "kind": "failure", "actor": "r-1",
                          "reason": "artifact mismatch", "version": live, "from_version": None,
                          "details": {"what": "artifact mismatch"}})
        return found


def test_bad_version_is_refused_by_promote_and_by_the_replicas(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = store.open_store(sqlite_url, upgrade=True)
    art = tmp_path / "artifacts" / "eagle3-0001"
    art.mkdir(parents=True)
    (art / "config.json").write_text("{}")
    (art / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="eagle3-0001", kind="eagle3",
                                  target_id="tiny", artifact_uri=str(art),
                                  sha256=store.write_manifest(art))
        store.set_live(session, version="eagle3-0001", actor="t", reason="first")

    def run_cli(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        got = CliRunner().invoke(app, [*args, "--database-url", sqlite_url])
        return subprocess.CompletedProcess(args, got.exit_code, got.stdout, got.stderr)

    monkeypatch.setattr(faults.procs, "run_cli", run_cli)
    view = _View(sqlite_url)
    ctx = SimpleNamespace(view=view, data_dir=tmp_path, env={}, deadline=time.time() + 10)
    rec = faults.bad_version(ctx)  # type: ignore[arg-type]
    view.close()
    assert rec.ok, rec.detail
    assert "exit 3" in rec.detail[0]
    with store.session_scope(engine, readonly=True) as session:
        assert store.get_live(session).version == "eagle3-0001"  # rolled back
    engine.dispose()

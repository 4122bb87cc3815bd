"""``autospec serve`` on SIGTERM or SIGINT leaves nothing running (issue 16, item 9): Serve,
the local Ray it started and every process of that Ray (GCS, raylet, dashboard and
runtime-env agents, workers) end with it. A real local Ray on the tiny random-init target."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autospec.bench.soak.procs import healthy
from autospec.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"autospec serve exited early ({proc.returncode}): "
                                 f"{proc.stdout.read() if proc.stdout else ''}")
        if healthy(url):  # autospec's own /health, not any 200 on the port
            return
        time.sleep(1.0)
    raise AssertionError(f"autospec serve not healthy within {timeout:.0f}s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_autospec_serve_leaves_no_process_behind_tiny(
        tiny_model_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOSPEC_DATA_DIR": str(tmp_path / "data"),
           "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    env.pop("AUTOSPEC_API_KEY", None)
    cmd = [sys.executable, "-m", "autospec.cli", "serve", "--target", str(tiny_model_dir),
           "--dtype", "float32", "--port", str(port), "--num-cpus", "0.5",
           "--database-url", f"sqlite:///{tmp_path / 'serve.db'}", "--startup-timeout", "240"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", timeout=300)
        children = psutil.Process(proc.pid).children(recursive=True)
        names = {c.name() for c in children}
        assert any("raylet" in n for n in names), names  # it did start a local Ray
        proc.send_signal(sig)
        proc.wait(timeout=120)
        _, alive = psutil.wait_procs(children, timeout=20)
        left = [f"{p.pid} {p.name()} {' '.join(p.cmdline()[:3])}" for p in alive
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"still running after {sig.name}: {left}"
    finally:
        for p in [*children, psutil.Process(proc.pid)] if proc.poll() is None else children:
            with contextlib.suppress(psutil.Error):
                p.kill()  # only the processes this test started

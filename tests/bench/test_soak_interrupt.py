"""An interrupted ``autospec bench soak`` takes what it started down with it (found starting
a 2-hour soak: SIGTERM to the soak left its ``autospec serve``, Ray and controller running).
Real processes: the soak's command body with its run replaced by one that starts a child."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    import autospec.bench.soak.cli as cli
    import autospec.bench.soak.runner as runner
    cli.STOP_GRACE_S = 1.0

    class FakeSoak:  # stands in for serve + controllers: one child that ignores SIGTERM
        def __init__(self, cfg, say):
            pass

        def run(self):
            child = subprocess.Popen([sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE,
                text=True)
            child.stdout.readline()
            print(child.pid, flush=True)
            time.sleep(600)

    runner.Soak = FakeSoak
    cli.run_soak(duration_min=1, rate=1, engine="native", target="tiny", dtype="auto",
                 out=__import__("pathlib").Path(sys.argv[1]), max_tokens=4,
                 cycle_interval_s=60, short=True, faults=None)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_soak_leaves_no_process(tmp_path: Path, sig: int, code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert psutil.pid_exists(child)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child)
    finally:
        proc.kill()

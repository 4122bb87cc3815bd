"""``autospec controller run`` on SIGTERM takes the processes it started down with it (found
by the 20-minute vLLM soak, issue 28: a cycle's speed-measurement vLLM engines outlived their
controller). Real processes: a child that exits on SIGTERM and one that ignores it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil

SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    from autospec.stopping import exit_on_sigterm
    exit_on_sigterm(grace_s=1.0)
    polite = subprocess.Popen(["sleep", "600"])
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    stubborn.stdout.readline()
    print(polite.pid, stubborn.pid, flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigterm_takes_every_child_down_and_exits_143() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    finally:
        proc.kill()


GRANDCHILD = textwrap.dedent("""
    import subprocess, sys, time
    from autospec.stopping import exit_on_sigterm
    exit_on_sigterm(grace_s=1.0)
    # a child that exits on SIGTERM but leaves behind a grandchild that ignores it
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
        "print(g.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    print(child.pid, grandchild, flush=True)
    time.sleep(600)
""")


def test_sigterm_kills_a_grandchild_its_parent_left_behind() -> None:
    proc = subprocess.Popen([sys.executable, "-c", GRANDCHILD], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        time.sleep(0.5)  # the grandchild's SIG_IGN in place
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    finally:
        proc.kill()

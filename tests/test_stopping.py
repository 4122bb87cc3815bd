"""``autospec controller run`` on SIGTERM takes the processes it started down with it (found
by the 20-minute vLLM soak, issue 28: a cycle's speed-measurement vLLM engines outlived their
controller). Real processes: a child that exits on SIGTERM and one that ignores it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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


def _still_running(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The ``pids`` not gone after waiting up to ``within_s`` for them all to go."""
    deadline = time.monotonic() + within_s
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def test_sigterm_takes_every_child_down_and_exits_143() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        left = _still_running(pids)
        assert not left, left
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
        left = _still_running(pids)
        assert not left, left
    finally:
        proc.kill()


LATE_SPAWN = textwrap.dedent("""
    import subprocess, sys, time
    from autospec.stopping import exit_on_sigterm
    exit_on_sigterm(grace_s=3.0)
    # a child that, asked to stop, first starts a process of its own (a vLLM EngineCore
    # still starting its worker), then exits: the new process is below the child only for
    # the half second before the child dies
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, subprocess, sys, time\\n"
        "def late(signum, frame):\\n"
        "    g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\\n"
        "    open(sys.argv[1], 'w').write(str(g.pid))\\n"
        "    time.sleep(0.5)\\n"
        "    sys.exit(0)\\n"
        "signal.signal(signal.SIGTERM, late)\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(600)\\n", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_sigterm_kills_a_process_a_child_started_while_stopping(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    proc = subprocess.Popen([sys.executable, "-c", LATE_SPAWN, str(pid_file)],
                            stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        grandchild = int(pid_file.read_text())
        assert not _still_running([child, grandchild]), "the late process outlived its controller"
    finally:
        proc.kill()
        if grandchild is not None and not _gone(grandchild):
            psutil.Process(grandchild).kill()

"""The processes a soak starts — ``autospec serve`` and ``autospec controller run`` as
subprocesses, nothing imported from them — their process trees, and the resident memory of
every process in them over time.

A process is named by :func:`label`: what it is (the serve command, a Ray Serve replica, a Ray
daemon, the controller) and its pid, so a restarted replica shows as a new line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests as http


def autospec_command() -> list[str]:
    """How to run ``autospec``: the script beside this interpreter, else ``python -c``."""
    script = Path(sys.executable).with_name("autospec")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from autospec.cli import app; app()"]


@dataclass
class Child:
    """A started subprocess and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def start(name: str, args: list[str], *, env: dict[str, str], logs: Path) -> Child:
    """Start ``autospec <args>`` with its output in ``logs/<name>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{name}.log"
    with path.open("ab") as out:
        popen = subprocess.Popen([*autospec_command(), *args], stdout=out,
                                 stderr=subprocess.STDOUT, env={**os.environ, **env})
    return Child(name, popen, path)


def run_cli(args: list[str], *, env: dict[str, str], timeout_s: float = 300.0
            ) -> subprocess.CompletedProcess[str]:
    """Run ``autospec <args>`` to the end (an operator's command)."""
    return subprocess.run([*autospec_command(), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout_s, check=False)


def wait_healthy(base_url: str, child: Child, timeout_s: float) -> float:
    """Seconds until ``/health`` answers 200; raises if ``child`` exits or time runs out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited with {child.popen.returncode}; "
                               f"see {child.log_path}")
        if healthy(base_url):
            return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"{base_url}/health not 200 within {timeout_s:.0f}s; see {child.log_path}")


def healthy(base_url: str) -> bool:
    """``/health`` answers 200 with autospec's body (``"ok": true``), not just any 200:
    another server on the port (Ray's metrics exporter once) answers every path so."""
    try:
        got = http.get(f"{base_url}/health", timeout=5)
        return got.status_code == 200 and got.json().get("ok") is True
    except (http.RequestException, ValueError, AttributeError):
        return False


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it (none if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _python_kind(args: list[str]) -> str:
    """A Python process by what it runs: a script's stem (Ray's helpers), ``-m``'s module,
    or for ``-c`` the multiprocessing role (vLLM's and torch's spawned helpers)."""
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1].rsplit(".", 1)[-1][:24]
        if arg == "-c" and i + 1 < len(args):
            code = args[i + 1]
            return ("mp-resource-tracker" if "resource_tracker" in code
                    else "mp-spawn" if "spawn_main" in code else "python-c")
        if not arg.startswith("-"):
            return Path(arg).stem[:24]
    return "python"


def label(p: psutil.Process) -> str:
    """What a process is, and its pid: ``serve[123]``, ``replica[456]``, ``raylet[789]``."""
    try:
        argv = p.cmdline()
        cmd = " ".join(argv)
        name = p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"gone[{p.pid}]"
    if "ServeReplica" in cmd:
        kind = "metrics-replica" if "Metrics" in cmd else "replica"
    elif "ProxyActor" in cmd:
        kind = "serve-proxy"
    elif "ServeController" in cmd:
        kind = "serve-controller"
    elif "controller run" in cmd or " controller " in cmd:
        kind = "controller"
    elif " serve " in f"{cmd} ":
        kind = "serve"
    elif name.startswith("python") and len(argv) > 1:
        kind = _python_kind(argv[1:])
    else:
        kind = (name or cmd.split(" ")[0]).removeprefix("ray::")[:24]
    return f"{kind}[{p.pid}]"


def replica_pids(serve_pid: int) -> list[int]:
    """Ray Serve replica workers of the serving deployment below ``autospec serve`` (their
    process title names them: ``ray::ServeReplica:<app>:<deployment>``)."""
    out = []
    for p in tree(serve_pid):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "ServeReplica" in cmd and "Metrics" not in cmd:  # not the metrics hub's replica
            out.append(p.pid)
    return out


def stop(child: Child, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> float | None:
    """Send ``sig``; seconds until it exited (None: still running after ``timeout_s``)."""
    started = time.monotonic()
    if child.alive():
        child.popen.send_signal(sig)
    try:
        child.popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - started


class MemorySampler:
    """Every ``interval_s``: the resident memory of each process below the given roots, and
    every process ever seen there (with its start time, to tell a reused pid)."""

    def __init__(self, roots: list[Child], interval_s: float = 10.0) -> None:
        self.roots, self.interval_s = roots, interval_s
        self.samples: list[tuple[float, str, int]] = []  # (time, label, rss bytes)
        self.seen: dict[int, tuple[float, str]] = {}  # pid -> (create_time, label)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-memory", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        now = time.time()
        for root in list(self.roots):
            for p in tree(root.pid):
                try:
                    rss = p.memory_info().rss
                    created = p.create_time()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                name = label(p)  # each time: a Ray worker is IDLE before it is a replica
                self.seen[p.pid] = (created, name)
                self.samples.append((now, name, rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)


def leftovers(seen: dict[int, tuple[float, str]]) -> list[str]:
    """Processes once seen below a root that still run (the same process: same start time)."""
    left = []
    for pid, (created, name) in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(name)
        except psutil.NoSuchProcess:
            continue
    return sorted(left)

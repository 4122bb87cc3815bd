"""A two-node Ray cluster on this machine from separate ``ray start`` processes.

Both nodes run ``ray start --block`` in their own session, on loopback, with a unique
``--temp-dir``, so this cluster never touches another Ray instance on the machine.
Teardown terminates exactly the two ``ray start`` processes (``--block`` makes each stop its
own node's processes on SIGTERM), then — by PID — any process still alive whose command line
names this cluster's temp dir. Never ``ray stop`` (that stops every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autospec.ports import free_port

RAY = str(Path(sys.executable).with_name("ray"))
# token auth off for this throwaway cluster: the driver (set the same variables before
# ray.init) and both nodes must agree, and the cluster is reachable only from this machine
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class TwoNodeCluster:
    """Head and worker node processes; ``address`` is ``127.0.0.1:<gcs port>``,
    ``client_address`` the head's Ray Client server (``ray://127.0.0.1:<port>``)."""

    def __init__(self, *, cpus_per_node: float = 2, log_dir: Path) -> None:
        self.temp_dir = f"/tmp/ras-{uuid.uuid4().hex[:8]}"  # short: socket path limits
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.client_port = free_port()  # not Ray's 10001: another cluster may hold it
        self.client_address = f"ray://127.0.0.1:{self.client_port}"
        self.cpus, self.log_dir = cpus_per_node, log_dir
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.log_dir / f"ray-{name}.log", "w")  # noqa: SIM115 — closed with the proc
        env = {**os.environ, **CLUSTER_ENV}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.Popen(
            [RAY, "start", "--block", f"--num-cpus={self.cpus}", f"--temp-dir={self.temp_dir}",
             f"--resources={json.dumps({name: 1})}", *args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)

    def start(self, timeout_s: float = 180, *, worker: bool = True) -> None:
        """The head node (up when this returns), then — unless ``worker=False`` — the worker."""
        self._start("head_node", ["--head", f"--port={self.port}", "--include-dashboard=false",
                                  f"--ray-client-server-port={self.client_port}"])
        self._wait(lambda: self._status_ok(), timeout_s, "the head node")
        if worker:
            self._start("worker_node", [f"--address={self.address}"])

    def alive(self) -> bool:
        """Whether the cluster answers ``ray status`` (raises if a node process has exited)."""
        return self._status_ok()

    def _status_ok(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}; see {self.log_dir}")
        rc = subprocess.run([RAY, "status", f"--address={self.address}"],
                            capture_output=True, timeout=60).returncode
        return rc == 0

    @staticmethod
    def _wait(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not come up within {timeout_s:.0f}s")
            time.sleep(1)

    def wait_for_nodes(self, ray, n: int = 2, timeout_s: float = 180) -> list[dict]:  # type: ignore[no-untyped-def]
        self._wait(lambda: len([x for x in ray.nodes() if x["Alive"]]) >= n, timeout_s,
                   f"{n} alive nodes")
        return [x for x in ray.nodes() if x["Alive"]]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: only this node
        self._kill_leftovers()
        self._keep_logs()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _keep_logs(self) -> None:
        """The nodes' own logs (Ray Client servers' included) into ``log_dir``, which the
        test keeps: the temp dir goes with the cluster."""
        logs = Path(self.temp_dir) / "session_latest" / "logs"
        with contextlib.suppress(OSError):
            shutil.copytree(logs, self.log_dir / "ray-session-logs", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.sock", "events"))

    def _kill_leftovers(self) -> None:
        """Processes of this cluster still alive (matched by our unique temp dir), by PID."""
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if self.temp_dir in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)


@contextlib.contextmanager
def two_nodes(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodeCluster]:
    """A started two-node cluster (2 CPUs a node), this process's environment set to match
    (token auth off, no inherited RAY_ADDRESS); stopped on exit."""
    for key, value in CLUSTER_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = TwoNodeCluster(cpus_per_node=2, log_dir=log_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

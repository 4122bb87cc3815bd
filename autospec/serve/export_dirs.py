"""Where a vLLM replica writes the versions it exports for vLLM: a folder of its own under
``<data dir>/vllm-exports/``, named after its host and process (``<host>-<pid>``), with the
process's start time in ``owner.json``.

An engine removes its export when it shuts down, and the replica its folder when it stops.
A replica that dies without either (Ray kills it: a failed health check, out of memory)
leaves its folder behind — an eagle3 head of an 8B target is about 0.85 GB — so the next
replica to start on that host removes the folders of this host's processes that are gone
(:func:`sweep_dead`). Other hosts' folders (a data dir shared between nodes) are left to
their own replicas."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

OWNER = "owner.json"


def replica_export_root(base: Path) -> Path:
    """This process's export folder under ``base`` (created), after removing those of this
    host's processes that are gone."""
    host = socket.gethostname()
    for gone in sweep_dead(base, host):
        log.info("removed %s: exports of a replica that is gone", gone)
    root = base / f"{host}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    (root / OWNER).write_text(json.dumps({"pid": os.getpid(), "started": _started(os.getpid())}))
    return root


def sweep_dead(base: Path, host: str) -> list[Path]:
    """Remove the folders under ``base`` of ``host``'s processes that are no longer running
    (a pid now used by a process started later is not the owner); the removed ones."""
    if not base.is_dir():
        return []
    removed = []
    for folder in base.iterdir():
        pid = _owner_pid(folder, host)
        if pid is None or pid == os.getpid() or _running(folder, pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _owner_pid(folder: Path, host: str) -> int | None:
    rest = folder.name.removeprefix(f"{host}-")
    if rest == folder.name or not rest.isdigit() or not folder.is_dir():
        return None
    return int(rest)


def _running(folder: Path, pid: int) -> bool:
    started = _started(pid)
    if started is None:
        return False
    try:
        owner = json.loads((folder / OWNER).read_text())
    except (OSError, ValueError):
        return True  # being created now, or unreadable: not ours to judge
    return abs(float(owner.get("started") or 0.0) - started) < 1.0


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None

"""A vLLM replica's export folder is its own (``<host>-<pid>``), and the next replica on the
host removes those of processes that are gone (a replica Ray killed never closed its
engines), leaving running processes' and other hosts' folders alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from autospec.serve.export_dirs import OWNER, replica_export_root, sweep_dead


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_replicas_exports_are_removed_and_the_rest_kept(tmp_path) -> None:
    host = socket.gethostname()
    dead = tmp_path / f"{host}-{_dead_pid()}"
    (dead / "eagle3-0001-k4-abc").mkdir(parents=True)
    (dead / OWNER).write_text(json.dumps({"pid": 1, "started": 0.0}))
    parent = tmp_path / f"{host}-{os.getppid()}"  # a running process: the owner's start time
    parent.mkdir()
    import psutil
    (parent / OWNER).write_text(json.dumps({"pid": os.getppid(),
                                            "started": psutil.Process(os.getppid()).create_time()}))
    other_host = tmp_path / f"another-host-{_dead_pid()}"
    other_host.mkdir()
    legacy = tmp_path / "suffix-0002-k4-xyz"  # a version folder of the old flat layout
    legacy.mkdir()

    root = replica_export_root(tmp_path)

    assert root == tmp_path / f"{host}-{os.getpid()}" and (root / OWNER).is_file()
    assert not dead.exists()
    assert parent.is_dir() and other_host.is_dir() and legacy.is_dir()


def test_a_pid_reused_by_a_later_process_does_not_keep_a_dead_owners_folder(tmp_path) -> None:
    host = socket.gethostname()
    folder = tmp_path / f"{host}-{os.getppid()}"  # running, but not the process that wrote it
    folder.mkdir()
    (folder / OWNER).write_text(json.dumps({"pid": os.getppid(), "started": 1.0}))
    assert sweep_dead(tmp_path, host) == [folder] and not folder.exists()

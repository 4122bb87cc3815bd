"""Training runs whose process died: found by the process they record, closed, swept.

Every run records the process that trains it (``config["process"]``: host name, pid and the
process's start time, :func:`this_process`). A run killed outright (SIGKILL, OOM killer,
power loss) cannot close itself: it stays ``running`` and may leave its unregistered
artifact (``.partial-run<id>-…``, :mod:`autospec.train.partials`). A controller closes the
runs of its own dead cycles; an operator's ``autospec train`` has no controller, so each new
run first closes the dead runs of its own host (:func:`sweep_dead_runs`): a run is dead when
no process with its pid started at its recorded time is alive. Runs of another host are left
alone (their process cannot be seen from here), as are runs that predate the record.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy.engine import Engine

from autospec import store
from autospec.train.partials import remove_partials

log = logging.getLogger(__name__)


def this_process() -> dict[str, Any]:
    """What a run records about the process training it."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": psutil.Process().create_time()}


def is_dead(process: dict[str, Any] | None) -> bool:
    """Whether the recorded ``process`` is known dead: on this host, and no process with its
    pid and start time is alive (a pid reused by a later process does not count)."""
    if not process or process.get("host") != socket.gethostname():
        return False
    try:
        started = psutil.Process(int(process["pid"])).create_time()
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
    return abs(started - float(process.get("started", started))) > 1.0


def sweep_dead_runs(engine: Engine, artifact_root: Path) -> list[int]:
    """Close as failed every ``running`` run of this host whose process died, and remove its
    unregistered artifact; the ids closed."""
    closed = []
    with store.session_scope(engine) as session:
        for run in store.list_training_runs(session, status="running", limit=1000):
            process = (run.config or {}).get("process")
            if not is_dead(process):
                continue
            store.finish_training_run(
                session, run_id=run.id, status="failed",
                error=f"interrupted: process {process['pid']} on {process['host']} died "
                      "while training")
            closed.append(run.id)
    for run_id in closed:
        removed = remove_partials(artifact_root, run_id)
        log.warning("closed training run %d: its process died%s", run_id,
                    f"; removed {', '.join(map(str, removed))}" if removed else "")
    return closed

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

import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy.engine import Engine

from autospec import store
from autospec.settings import get_settings
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
    unregistered artifact and the Ray Train folders of dead processes under the data
    directory's ``ray-train`` (:func:`sweep_dead_ray_storage`); the ids closed."""
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
    for folder in sweep_dead_ray_storage(get_settings().data_dir / "ray-train"):
        log.warning("removed %s: the Ray Train job and checkpoints of a run whose process died",
                    folder)
    for run_id in closed:
        removed = remove_partials(artifact_root, run_id)
        log.warning("closed training run %d: its process died%s", run_id,
                    f"; removed {', '.join(map(str, removed))}" if removed else "")
    return closed


def sweep_dead_ray_storage(storage: Path) -> list[Path]:
    """Remove each Ray Train run folder under ``storage`` (its job: a copy of the features and
    weights; its checkpoints) whose job names a driver process known dead (:func:`is_dead`):
    ``ray_fit`` removes its folder however the run ends, but not when its process is killed
    outright (SIGKILL mid-training left hundreds of MB per run). The folders removed."""
    removed = []
    for spec in sorted(Path(storage).glob("*/job/job.json")):
        try:
            process = json.loads(spec.read_text()).get("process")
        except (OSError, ValueError, AttributeError):
            continue
        if is_dead(process):
            shutil.rmtree(spec.parent.parent, ignore_errors=True)
            removed.append(spec.parent.parent)
    return removed

"""Where a training run's artifact is written before it is registered, and how a dead run's
is swept.

A run saves its candidate to ``.partial-run<run id>-<random>`` under the artifact directory,
then renames it to its version's name in the registering transaction. A process killed
between the two (SIGKILL, power loss) leaves the partial directory behind; the controller
that closes the dead cycle's runs removes theirs, and the next run on the host removes those of
runs whose process died (:mod:`autospec.train.dead_runs`), both with :func:`remove_partials`,
so nothing unregistered piles up in the artifact directory.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path


def partial_dir(root: Path, run_id: int) -> Path:
    """A fresh directory name under ``root`` for run ``run_id``'s artifact (not created)."""
    return root / f".partial-run{run_id}-{uuid.uuid4().hex}"


def remove_partials(root: Path, run_id: int) -> list[Path]:
    """Remove what run ``run_id`` left under ``root``; the paths removed."""
    found = sorted(root.glob(f".partial-run{run_id}-*"))
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
    return [p for p in found if not p.exists()]

"""Writes that wait out a store outage: a locked SQLite file, a PostgreSQL restarting.

A write that fails because the database cannot be reached or is locked past its busy timeout
is tried again, with a growing pause, until ``deadline_s`` has passed; any other error (a
conflict, a constraint) is raised at once. Used where giving up loses work the store cannot
rebuild: a training run's registration (the candidate) and its failure record (else the run
stays ``running``). Found by issue 28's fault: the database unreachable while a cycle
registers a version (``tests/train/test_register_db_locked.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import OperationalError

from autospec.store.errors import DatabaseUnreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long a write keeps trying while the store is out (the soak's outage is 60 s)
DEFAULT_DEADLINE_S = 120.0
#: errors that say the store is out for now, not that the write is wrong
TRANSIENT = (OperationalError, DatabaseUnreachable)


def retrying(what: str, write: Callable[[], T], *, deadline_s: float | None = None,
             first_pause_s: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """``write()``, tried again while it fails with a :data:`TRANSIENT` error and
    ``deadline_s`` (default :data:`DEFAULT_DEADLINE_S`) has not passed (pauses 1, 2, 4... s,
    at most 10 s); ``what`` names it in the log."""
    deadline_s = DEFAULT_DEADLINE_S if deadline_s is None else deadline_s
    started, pause = time.monotonic(), first_pause_s
    while True:
        try:
            return write()
        except TRANSIENT as exc:
            waited = time.monotonic() - started
            if waited + pause > deadline_s:
                raise
            log.warning("%s: the store is out (%s); trying again in %.0f s (%.0f s so far)",
                        what, _short(exc), pause, waited)
            sleep(pause)
            pause = min(pause * 2, 10.0)


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__

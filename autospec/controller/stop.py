"""How ``autospec controller run`` stops: on SIGTERM (a process manager, Kubernetes, the
soak) or Ctrl-C it takes every process below it down with it and exits at once.

A cycle on the vLLM engine measures speed in vLLM engines it starts (an ``EngineCore``
process and its worker); a controller that died without closing them left them running —
the 20-minute vLLM soak (issue 28) found two engines still up after the run. The cycle that
was running is left to the lease, as after a crash: the next controller records it
interrupted, and nothing half-promoted stays behind (promotion is one transaction).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from types import FrameType

import psutil

log = logging.getLogger(__name__)


def reap_children(grace_s: float = 5.0) -> list[int]:
    """Terminate every process below this one, kill what is left after ``grace_s``; their
    pids."""
    kids = psutil.Process().children(recursive=True)
    for proc in kids:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(kids, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in kids]


def stop_now(code: int, grace_s: float = 5.0) -> None:
    """Take the children down and exit with ``code`` without waiting for running jobs."""
    pids = reap_children(grace_s)
    if pids:
        log.warning("stopping: took down %d child process(es): %s", len(pids), pids)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def exit_on_sigterm(grace_s: float = 5.0) -> None:
    """SIGTERM stops this process as :func:`stop_now` (exit status 143)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop_now(128 + signum, grace_s)

    signal.signal(signal.SIGTERM, handler)

"""How a long-running command stops on SIGTERM (a process manager, Kubernetes, the soak) or
Ctrl-C: it takes every process below it down with it and exits at once.

Used by ``autospec controller run`` — a cycle on the vLLM engine measures speed in vLLM
engines it starts (an ``EngineCore`` process and its worker); a controller that died without
closing them left them running (the 20-minute vLLM soak, issue 28, found two engines up
after the run) — and by ``autospec bench soak``, whose ``autospec serve`` (a local Ray) and
controllers outlived an interrupted soak. The direct children are asked first (SIGTERM: a
``serve`` shuts its Ray down, an ``EngineCore`` its worker); whatever is still running below
after the grace period is killed. A controller's running cycle is left to the lease, as
after a crash: the next controller records it interrupted, and nothing half-promoted stays
behind (promotion is one transaction).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from types import FrameType

import psutil

log = logging.getLogger(__name__)


def reap_children(grace_s: float = 5.0, poll_s: float = 0.1) -> list[int]:
    """SIGTERM the direct children, then SIGKILL every process below this one still running
    after ``grace_s``; the pids of all that were below. The tree is read again every
    ``poll_s`` while the children stop: a child starting a process of its own meanwhile (a
    vLLM ``EngineCore`` still starting its worker when SIGTERM came) would otherwise leave
    it behind, no longer below this one once its parent is gone (the 30-minute vLLM soak of
    2026-12-05)."""
    me = psutil.Process()
    everyone = {p.pid: p for p in me.children(recursive=True)}
    direct = me.children()
    for proc in direct:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _gather(me, everyone)
        if not any(_running(p) for p in direct):
            break
        time.sleep(poll_s)
    _gather(me, everyone)
    left = [p for p in everyone.values() if _running(p)]
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(left, timeout=grace_s)
    return list(everyone)


def _gather(me: psutil.Process, seen: dict[int, psutil.Process]) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        for proc in me.children(recursive=True):
            seen.setdefault(proc.pid, proc)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_now(code: int, grace_s: float = 5.0) -> None:
    """Take the children down and exit with ``code`` without waiting for running jobs."""
    pids = reap_children(grace_s)
    if pids:
        log.warning("stopping: took down %d process(es) below this one: %s", len(pids), pids)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def exit_on_sigterm(grace_s: float = 5.0) -> None:
    """SIGTERM stops this process as :func:`stop_now` (exit status 143); SIGINT raises
    KeyboardInterrupt (the caller stops with 130) even where the shell that started this
    process ignored it (a background job without job control: CI, scripts), as
    ``autospec serve`` does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop_now(128 + signum, grace_s)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupt_on_sigterm() -> None:
    """SIGTERM (and SIGINT, even where the shell that started this process ignored it)
    raises KeyboardInterrupt in the main thread, its args naming the signal: a command with
    nothing of its own to take down (``controller once`` and ``watch``) unwinds, giving its
    lease back on the way, instead of dying with it held until its TTL."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by ``exc``: 143 for SIGTERM, else 130."""
    return 128 + (signal.SIGTERM if exc.args[:1] == ("SIGTERM",) else signal.SIGINT)

"""``controller once`` (and ``watch``) stopped by SIGTERM give their lease back (found by an
operator trial, 2026-12-07: a `controller once` sent SIGTERM mid-evaluation — a CronJob's
deadline, systemd stopping a timer's unit — died at once, exit 143, its lease held until its
TTL: every controller for the next 5 minutes of the shipped policies answered busy, and
status showed the dead cycle running). SIGTERM now unwinds as Ctrl-C does: one line, exit
143, the lease released, and the next cycle at once records the stopped one interrupted.
Real SQLite file, tiny target, a real SIGTERM to this process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import typer

from autospec import store
from autospec.controller import records, run_cli
from autospec.controller.cycle import Controller

from .helpers import fast_policy, log_traffic


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_sigterm_mid_cycle_gives_the_lease_back_tiny(db, tiny, traffic, handlers, capsys) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    term = {"evaluated": lambda: os.kill(os.getpid(), signal.SIGTERM)}
    with pytest.raises(typer.Exit) as stopped, run_cli._stopped():
        Controller(db, fast_policy(), tiny, hooks=term).run_cycle(trigger="once")
    assert stopped.value.exit_code == 143
    assert "stopped (SIGTERM): the lease is given back" in " ".join(capsys.readouterr().err.split())
    with store.session_scope(db, readonly=True) as session:
        assert store.get_lease(session, name=records.lease_name("default")) is None
    result = Controller(db, fast_policy(), tiny).run_cycle(trigger="once")  # not busy
    assert result.outcome == "promoted", result.reasons
    with store.session_scope(db, readonly=True) as session:
        assert [c.outcome for c in records.cycles(session, deployment="default")] == [
            "promoted", "interrupted"]

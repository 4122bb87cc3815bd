"""Two soak faults judged on what they test, not on the machine's pace (flaky-audit
findings): the controller is not killed when too little traffic time is left for its
successor to close the dead cycle; and the read-only artifact directory is judged by what was
registered while it was read-only, not by whether the cycle promoted a kind it saved before."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from autospec.bench.soak import faults


class _Controller:
    def __init__(self) -> None:
        self.killed, self.pid = False, 4242
        self.popen = SimpleNamespace(send_signal=self._kill, wait=lambda: None)

    def _kill(self, _sig: int) -> None:
        self.killed = True

    def alive(self) -> bool:
        return not self.killed


def test_no_controller_is_killed_without_time_left_for_its_recovery() -> None:
    controller = _Controller()
    view = SimpleNamespace(training_running_since=lambda since: True, last_event_id=lambda: 0,
                           events=lambda before: [])
    ctx = SimpleNamespace(view=view, controller=controller, start_controller=_Controller,
                          deadline=time.time() + faults.CONTROLLER_RECOVERY_S / 3)
    rec = faults.controller_sigkill(ctx, when="training")  # type: ignore[arg-type]
    assert rec.skipped and not controller.killed


class _View:
    """A cycle that promotes ``suffix-2``, registered while the directory was read-only
    (``during``) or 5 s before it turned read-only."""

    def __init__(self, during: bool) -> None:
        self.during, self.before, self.cycle_end = during, time.time() - 5, None

    def training_running_since(self, since: float) -> bool:
        return True

    def last_event_id(self) -> int:
        return 0

    def events(self, before: int) -> list[dict[str, Any]]:  # read while it is read-only
        self.cycle_end = time.time()
        return [{"kind": "note", "at": self.cycle_end, "reason": "cycle",
                 "details": {"type": "cycle", "outcome": "promoted", "promoted": "suffix-2"}}]

    def versions(self) -> list[dict[str, Any]]:
        assert self.cycle_end is not None
        return [{"version": "suffix-2",
                 "registered_at": self.cycle_end if self.during else self.before}]


def _read_only_fault(tmp_path, during: bool):  # type: ignore[no-untyped-def]
    ctx = SimpleNamespace(view=_View(during), controller=_Controller(),
                          data_dir=tmp_path, deadline=time.time() + 30)
    return faults.artifacts_read_only(ctx)  # type: ignore[arg-type]


def test_a_kind_saved_before_the_directory_turned_read_only_may_be_promoted(tmp_path) -> None:
    rec = _read_only_fault(tmp_path, during=False)
    assert rec.ok, rec.detail


def test_a_version_registered_while_the_directory_was_read_only_fails_the_fault(tmp_path) -> None:
    rec = _read_only_fault(tmp_path, during=True)
    assert not rec.ok and "registered while read-only" in " ".join(rec.detail), rec.detail

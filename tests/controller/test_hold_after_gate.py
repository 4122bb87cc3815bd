"""``AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S`` (crash drills): a cycle waits between a candidate
passing its gate and the promotion only when one passed, and never by default. The native
soak's "controller SIGKILL right after the gate passed" was skipped in a 2-hour run: the
promote verdict and the pointer move were 12 ms apart."""

from __future__ import annotations

import pytest

from autospec.controller import drills
from autospec.controller.candidates import Candidate
from autospec.settings import get_settings


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    got: list[float] = []
    monkeypatch.setattr(drills.time, "sleep", got.append)
    get_settings.cache_clear()
    yield got
    get_settings.cache_clear()


def test_no_hold_by_default(slept: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S", raising=False)
    assert drills.hold_after_gate([Candidate("eagle3-1", 1, promote=True)]) == 0.0
    assert slept == []


def test_holds_only_when_a_candidate_passed(slept: list[float],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S", "15")
    assert drills.hold_after_gate([Candidate("eagle3-1", 1), Candidate("suffix-1", 2)]) == 0.0
    assert slept == []
    passed = [Candidate("eagle3-1", 1), Candidate("suffix-1", 2, promote=True)]
    assert drills.hold_after_gate(passed) == 15.0
    assert slept == [15.0]


def test_a_bad_hold_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from autospec.settings import SettingsError

    monkeypatch.setenv("AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S", "-1")
    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError, match="AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S='-1'"):
            get_settings()
    finally:
        get_settings.cache_clear()

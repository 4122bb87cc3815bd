"""A scheduled cycle hands the heap it freed back to the OS, whether it ended well or not
(:func:`autospec.controller.scheduler.run_cycle_job`; the trim itself is measured in
tests/serve/test_memory_trim.py). Stand-in controller: what is checked is the order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autospec.controller import scheduler


def test_every_scheduled_cycle_is_followed_by_a_trim(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(scheduler, "release_freed_memory", lambda: calls.append("trim"))
    monkeypatch.setattr(scheduler, "cycle_summary", lambda result: "ok")
    result = SimpleNamespace(as_dict=lambda: {"outcome": "promoted"})

    def cycle(trigger: str) -> object:
        calls.append(f"cycle:{trigger}")
        return result

    assert scheduler.run_cycle_job(SimpleNamespace(run_cycle=cycle)) == {"outcome": "promoted"}
    assert calls == ["cycle:schedule", "trim"]

    def broken(trigger: str) -> object:
        calls.append("broken")
        raise RuntimeError("store gone")

    with pytest.raises(RuntimeError):
        scheduler.run_cycle_job(SimpleNamespace(run_cycle=broken))
    assert calls[-2:] == ["broken", "trim"]

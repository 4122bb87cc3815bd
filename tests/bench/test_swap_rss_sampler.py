"""The swap bench's memory peak covers its whole window: memory the engine hands back while
the window is open must not leave the peak under the reading it started from (CI saw
peak 5948 MB < before 5974 MB when vLLM released pages during the swaps)."""

from __future__ import annotations

import itertools

from autospec.bench import swap


def test_the_peak_is_never_under_the_window_start_when_memory_falls(monkeypatch) -> None:
    readings = itertools.count(6000, -10)  # every sample lower than the one before
    monkeypatch.setattr(swap, "tree_rss_mb", lambda: float(next(readings)))
    sampler = swap._Sampler()
    start = sampler.peak
    sampler.start()
    peak = sampler.stop()
    assert start == 6000.0
    assert peak >= start


def test_the_peak_takes_a_rise_between_samples_at_the_window_end(monkeypatch) -> None:
    readings = iter([100.0, 500.0])  # the start, then one reading at stop (no 0.2 s sample)
    monkeypatch.setattr(swap, "tree_rss_mb", lambda: next(readings, 100.0))
    sampler = swap._Sampler()
    sampler.start()
    assert sampler.stop() == 500.0

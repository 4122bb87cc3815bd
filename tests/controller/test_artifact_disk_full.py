"""A candidate whose artifact cannot be written — the artifact directory's disk full (found
by an operator trial, 2026-12-07, on a 2 MB tmpfs) — fails its kind in one line naming the
directory and the system's reason, as any training failure does: safetensors' error (and an
OSError of config.json) escaped the cycle's training step into its catch-all, which logged a
traceback and recorded 'SafetensorError: Error while serializing: ...' without the path.
The run is closed failed and no partial directory stays. Real SQLite file, tiny target."""

from __future__ import annotations

import errno
import logging

import pytest
from safetensors import SafetensorError

from autospec import store
from autospec.controller.cycle import Controller
from autospec.settings import get_settings
from autospec.store.models import TrainingRun

from .helpers import fast_policy, log_traffic

FULL = [SafetensorError("Error while serializing: I/O error: No space left on device "
                        "(os error 28)"),
        OSError(errno.ENOSPC, "No space left on device")]


@pytest.mark.parametrize("error", FULL, ids=["safetensors", "oserror"])
def test_an_artifact_disk_full_fails_the_kind_in_one_line_tiny(
        db, tiny, traffic, monkeypatch, caplog, error) -> None:  # type: ignore[no-untyped-def]
    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise error

    log_traffic(db, traffic)
    monkeypatch.setattr("autospec.speculators.checkpoint.save_tensors", full)
    caplog.set_level(logging.INFO)
    result = Controller(db, fast_policy(), tiny).run_cycle(trigger="once")
    root = get_settings().resolved_artifact_dir
    assert result.outcome == "failed"
    assert result.reasons[0].startswith(
        f"training suffix failed: cannot write the candidate's artifact in {root}: "), result
    assert "No space left on device" in result.reasons[0]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    with store.session_scope(db, readonly=True) as session:
        (run,) = session.query(TrainingRun).all()
        assert run.status == "failed" and "No space left on device" in (run.error or "")
    assert not list(root.glob(".partial-*"))

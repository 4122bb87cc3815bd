"""``fit_off_the_main_thread``: Ray Train's ``fit`` from the main thread installs its own
Ctrl-C handler for good (ray 2.60, Train V2: abort the run, ``sys.exit(0)``); run off the
main thread it installs none. While it waits it asks ``should_stop`` (:class:`RunStop`): the
stop marker it writes, the workers' word read back, a run that does not end given up. Fake
trainers that do what Ray's and the workers do, no Ray."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path

import pytest

from autospec.train.errors import TrainingStopped
from autospec.train.ray_trainer import (
    PLACEMENT_FILE,
    STOP_FILE,
    STOPPED_FILE,
    RunStop,
    fit_off_the_main_thread,
)


class _RayLikeTrainer:
    """Registers a SIGINT handler when fit runs in the main thread, as Ray Train V2 does."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.threads = error, []

    def fit(self) -> str:
        self.threads.append(threading.current_thread())
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, lambda *_: None)
        if self.error is not None:
            raise self.error
        return "result"


def test_fit_leaves_ctrl_c_as_it_was_and_returns_the_result() -> None:
    before = signal.getsignal(signal.SIGINT)
    trainer = _RayLikeTrainer()
    try:
        assert fit_off_the_main_thread(trainer) == "result"
        assert signal.getsignal(signal.SIGINT) is before
        assert trainer.threads and trainer.threads[0] is not threading.main_thread()
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_failed_fit_raises_its_error_in_the_caller() -> None:
    with pytest.raises(ValueError, match="workers died"):
        fit_off_the_main_thread(_RayLikeTrainer(ValueError("workers died")))


class _RunOnWorkers:
    """Stands for the workers: ends the run once the stop marker is in the job, saying so as
    rank 0 does (``hang``: never ends, as a step that hangs)."""

    def __init__(self, job: Path, *, hang: bool = False) -> None:
        self.job, self.hang, self.release = job, hang, threading.Event()

    def fit(self) -> str:
        while not self.release.wait(0.05):
            if not self.hang and (self.job / STOP_FILE).exists():
                (self.job / STOPPED_FILE).write_text("stopped on request at step 7")
                break
        return "result"


def test_a_stop_request_reaches_the_workers_and_their_stop_is_training_stopped(
        tmp_path: Path) -> None:
    asked = itertools.count()
    run = _RunOnWorkers(tmp_path)
    with pytest.raises(TrainingStopped, match=r"^stopped on request at step 7$"):
        fit_off_the_main_thread(run, RunStop(lambda: next(asked) >= 2, tmp_path, grace_s=60))
    assert (tmp_path / STOP_FILE).exists()


def test_a_run_asked_to_stop_that_does_not_end_is_given_up_after_the_grace(
        tmp_path: Path) -> None:
    run = _RunOnWorkers(tmp_path, hang=True)
    started = time.monotonic()
    try:
        with pytest.raises(TrainingStopped, match="had not ended 1s after it was asked to"):
            fit_off_the_main_thread(run, RunStop(lambda: True, tmp_path, grace_s=1.0))
    finally:
        run.release.set()
    assert time.monotonic() - started < 10
    assert (tmp_path / STOP_FILE).exists()


def test_a_placement_group_that_cannot_be_removed_still_gives_the_run_up(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The driver ends a given-up run's workers by removing the placement group rank 0 named
    in the job; a name it cannot use is logged and the run is given up all the same."""
    (tmp_path / PLACEMENT_FILE).write_text("not a placement group")
    run = _RunOnWorkers(tmp_path, hang=True)
    try:
        with pytest.raises(TrainingStopped, match=r"asked to and is left to end by itself$"):
            fit_off_the_main_thread(run, RunStop(lambda: True, tmp_path, grace_s=0.5))
    finally:
        run.release.set()
    assert "could not remove the placement group 'not a placement group'" in caplog.text


def test_a_run_never_asked_to_stop_returns_its_result(tmp_path: Path) -> None:
    run = _RunOnWorkers(tmp_path)
    threading.Timer(1.0, run.release.set).start()
    assert fit_off_the_main_thread(run, RunStop(lambda: False, tmp_path, 1.0)) == "result"
    assert not (tmp_path / STOP_FILE).exists()

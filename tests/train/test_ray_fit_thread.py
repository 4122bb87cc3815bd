"""``fit_off_the_main_thread``: Ray Train's ``fit`` from the main thread installs its own
Ctrl-C handler for good (ray 2.60, Train V2: abort the run, ``sys.exit(0)``); run off the
main thread it installs none. A fake trainer that does what Ray's does, no Ray."""

from __future__ import annotations

import signal
import threading

import pytest

from autospec.train.ray_trainer import fit_off_the_main_thread


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

"""A cycle that fails while saving its candidate (a full or read-only artifact directory)
keeps nothing of it: after it, the tensors alive in the controller's process are those
alive after a cycle that ended well (tiny random-init target; the 2-hour soak's controller
stepped up ~300 MiB at such a cycle, docs/soak.md — this pins that no tensor is kept)."""

from __future__ import annotations

import errno
import gc
import logging
from datetime import timedelta

import torch

from autospec.controller.cycle import Controller
from autospec.train import register as train_register

from .helpers import T0, fast_policy, log_traffic


def _live_tensors() -> tuple[int, int]:
    gc.collect()
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return len(found), sum(t.numel() * t.element_size() for t in found)


def test_a_cycle_failing_at_the_save_keeps_no_tensor(db, tiny, traffic, monkeypatch) -> None:
    policy = fast_policy(training={"kinds": ["eagle3"], "min_train_requests": 5},
                         gate={"min_gain": 0.001})
    controller = Controller(db, policy, tiny)
    log_traffic(db, traffic)
    assert controller.run_cycle().outcome in ("promoted", "rejected")
    before = _live_tensors()

    def full(*args: object, **kwargs: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(train_register, "save_speculator", full)
        # pytest's log capture keeps each record, and a record its exception's frames: the
        # cycle's log lines stop at its own logger here, as a stream handler drops them
        patch.setattr(logging.getLogger("autospec.controller.cycle"), "propagate", False)
        log_traffic(db, traffic, start=T0 + timedelta(minutes=10))
        failed = controller.run_cycle()
    assert failed.outcome == "failed" and "No space left" in failed.reasons[-1], failed.reasons
    assert _live_tensors() == before

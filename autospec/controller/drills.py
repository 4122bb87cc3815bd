"""Crash drills: a moment a fault injector needs held open, off by default."""

from __future__ import annotations

import logging
import time

from autospec.controller.candidates import Candidate
from autospec.settings import get_settings

log = logging.getLogger(__name__)


def hold_after_gate(candidates: list[Candidate]) -> float:
    """Crash drills: wait ``AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S`` when a candidate passed its
    gate, before the promotion (the lease's heartbeat keeps it meanwhile). The soak's
    "controller SIGKILL right after the gate passed" needs that moment; on the native engine
    the verdict and the pointer move are otherwise milliseconds apart. Returns the seconds
    held (0 in production)."""
    hold = get_settings().cycle_hold_after_gate_s
    if hold <= 0 or not any(c.promote for c in candidates):
        return 0.0
    log.warning("holding %.0fs between the gate and the promotion "
                "(AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S: a crash drill)", hold)
    time.sleep(hold)
    return hold

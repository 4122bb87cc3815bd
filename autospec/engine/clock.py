"""Wall-clock reads that wait for the device: timing asynchronous kernel launches.

On CUDA a forward returns once its kernels are queued, not run; ``time.perf_counter()``
around it measures the launch. :func:`clock` first waits for the work queued on the device
(``torch.accelerator.synchronize``; nothing to wait for on the CPU), so the difference of
two reads taken around a region is the time the device spent on it.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait until the kernels queued on ``device`` have run (no-op on the CPU or None)."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cpu":
        return
    torch.accelerator.synchronize(device)


def clock(device: torch.device | str | None) -> float:
    """``time.perf_counter()`` once ``device`` is idle; read it at both ends of a region."""
    synchronize(device)
    return time.perf_counter()

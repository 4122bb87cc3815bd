"""Torch CPU threads: the cap on the controller's torch work, and running a block on N threads.

One meaning throughout: a count of **torch CPU threads** (``torch.set_num_threads``) a piece
of work runs on. The controller's cap (the policy's ``threads``, ``autospec controller
run|once|watch --threads``) bounds everything a cycle computes with torch in the
controller's process — loading the target, feature extraction, in-process training, shadow
replay, the cost model and the speed measurement (which runs on the replicas' recorded count
when that is within the cap, :mod:`autospec.evaluate.speed`) — and, per node, the Ray Train
workers a cycle starts (:func:`worker_threads`).

``auto`` (the default) leaves one CPU to whatever else runs on the machine: at most the CPUs
this process may use less one, at least 1, and never more than torch would use anyway
(``torch.get_num_threads()``: the physical cores, or ``OMP_NUM_THREADS``). The reason is the
soak of issue 28 (docs/soak.md): on a 2-core machine a controller training on both cores
beside a replica (which decodes on its one thread) left the replica's requests queued past
the client's timeout. On a big machine one CPU is a small price; a GPU machine's training
barely uses CPU threads at all.

Knows nothing of policies or Ray: callers hand it a setting and, for workers, their count.
Torch is imported by the functions that call it (a policy loads, and the CLI answers
``--help``, without it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

AUTO = "auto"
#: a thread cap as policies and options give it: a count, or ``auto``
ThreadSetting = int | Literal["auto"]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def resolve_threads(setting: ThreadSetting) -> int:
    """The thread count ``setting`` means in this process: a count as it is, ``auto`` as the
    module docstring says."""
    if setting == AUTO:
        import torch

        return max(1, min(torch.get_num_threads(), usable_cpus() - 1))
    if not isinstance(setting, int) or isinstance(setting, bool) or setting < 1:
        raise ValueError(f"threads must be 'auto' or a count of at least 1, got {setting!r}")
    return setting


def worker_threads(setting: ThreadSetting | None, local_workers: int) -> int:
    """Torch threads of one of ``local_workers`` Ray Train workers on a node. ``None``: the
    node's CPUs shared out (no cap); ``auto``: the node's CPUs less one, shared out; a count
    N: N shared out, never more than the node's share. At least 1 each: workers beyond the
    cap still run, one thread each. Ray starts workers with ``OMP_NUM_THREADS=1``, so torch's
    own count says nothing here; the node's CPUs are counted instead."""
    local = max(1, local_workers)
    cpus = usable_cpus()
    if setting is None:
        budget = cpus
    elif setting == AUTO:
        budget = cpus - 1
    else:
        budget = min(resolve_threads(setting), cpus)
    return max(1, budget // local)


@contextmanager
def torch_threads(n: int | None) -> Iterator[int]:
    """Run the block on ``n`` torch threads (None: as it is); the count it ran on."""
    import torch

    before = torch.get_num_threads()
    if n is None or n == before:
        yield before
        return
    torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@contextmanager
def set_num_threads_kept() -> Iterator[None]:
    """``torch.set_num_threads`` works again after the block. Around a vLLM engine built in
    this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): vLLM's CPU worker replaces it with a
    no-op for the rest of the process, which would silently lift every later cap
    (:func:`torch_threads`: a cycle's training after the gate's vLLM measurement)."""
    import torch

    real = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = real


def within(n: int | None, cap: int | None) -> int | None:
    """``n`` bounded by ``cap`` (either None: the other)."""
    if cap is None or n is None:
        return cap if n is None else n
    return min(n, cap)

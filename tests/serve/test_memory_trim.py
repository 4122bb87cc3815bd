"""Freed heap pages go back to the OS after a swap (glibc), not kept as a growing floor."""

from __future__ import annotations

import gc
import sys

import psutil
import pytest

from autospec.serve.memory import release_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_freed_small_blocks_are_returned_after_trim() -> None:
    proc = psutil.Process()
    release_freed_memory()
    before = proc.memory_info().rss
    # 64 KiB blocks (below mmap's threshold, so on glibc's heap), each followed by a small one
    # that stays: freeing the big ones leaves holes the heap's top trim cannot give back
    pairs = [(bytearray(64 * 1024 - 64), bytearray(1024)) for _ in range(3000)]  # ~190 MiB
    kept = [small for _, small in pairs]
    del pairs
    gc.collect()
    held = proc.memory_info().rss
    assert held - before > 150 * 2**20  # freed, still resident: what a soak reads as growth
    assert release_freed_memory() is True
    after = proc.memory_info().rss
    assert after - before < 60 * 2**20, (before, held, after)
    assert len(kept) == 3000

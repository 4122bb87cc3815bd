"""Token ids ↔ bytes: little-endian int32, 4 bytes a token, identical on SQLite and PostgreSQL."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

_INT32 = "i"
assert array(_INT32).itemsize == 4


def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    """Pack token ids (each in int32 range) into bytes; None stays None."""
    if ids is None:
        return None
    packed = array(_INT32, ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(blob: bytes | memoryview | None) -> list[int] | None:
    """The inverse of :func:`pack_ids`."""
    if blob is None:
        return None
    data = bytes(blob)
    if len(data) % 4:
        raise ValueError(f"token id blob of {len(data)} bytes is not a multiple of 4")
    packed = array(_INT32)
    packed.frombytes(data)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()

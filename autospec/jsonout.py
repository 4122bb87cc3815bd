"""How the CLI writes values JSON has no type for: a time as ISO 8601 (``2026-12-06T14:57:17
.006650+00:00``, what ``jq``, JavaScript's ``Date`` and ``datetime.fromisoformat`` read),
anything else as its ``str``."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any


def json_default(value: Any) -> str:
    """``json.dumps(..., default=json_default)``."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)

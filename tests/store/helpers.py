"""Small helpers shared by the store tests (and their worker processes)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select

from autospec.store.models import Request


def record_fields(i: int, **over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "prompt_text": f"prompt {i}",
        "output_text": f"output {i}",
        "prompt_ids": [1, 2, 3, i % 1000],
        "output_ids": [4, 5, i % 1000],
        "segment": "chat" if i % 2 else "code",
        "speculator_version": "v1",
        "num_drafts": 4,
        "num_draft_tokens": 12,
        "num_accepted_tokens": 6,
        "accepted_per_position": [3, 2, 1],
        "latency_ms": 10.0,
        "request_uid": f"req-{i}",
    }
    fields.update(over)
    return fields


def count_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(Request)) or 0


def uid_counts(engine: Engine) -> tuple[int, int]:
    """(rows, distinct request uids)."""
    with engine.connect() as conn:
        rows = conn.scalar(select(func.count()).select_from(Request)) or 0
        distinct = conn.scalar(select(func.count(func.distinct(Request.request_uid)))) or 0
    return rows, distinct

"""Process bodies for the multi-process SQLite test (importable, so ``spawn`` can run them)."""

from __future__ import annotations

import logging
import time
import traceback
from datetime import timedelta
from typing import Any

from .helpers import record_fields


class _LockedCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "locked" in record.getMessage():
            self.count += 1


def _watch_logs() -> _LockedCounter:
    handler = _LockedCounter()
    logging.getLogger("autospec").addHandler(handler)
    return handler


def writer(url: str, spill_dir: str, wid: int, seconds: float, out: Any) -> None:
    from autospec.store import db
    from autospec.store.writer import TrafficWriter

    logs = _watch_logs()
    try:
        w = TrafficWriter(db.make_engine(url), spill_dir=spill_dir, batch_size=200)
        sent = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(25):
                w.record(**record_fields(sent, request_uid=f"w{wid}-{sent}"))
                sent += 1
            time.sleep(0.05)
        w.close()
        out.put({"role": "writer", "sent": sent, "counters": w.counters.as_dict(),
                 "locked": logs.count, "error": None})
    except BaseException:
        out.put({"role": "writer", "error": traceback.format_exc()})


def reader(url: str, seconds: float, out: Any) -> None:
    from autospec import store

    engine = store.make_engine(url)
    loops, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with store.session_scope(engine, readonly=True) as s:
                store.live_tau(s, by_segment=True)
                store.request_counts(s, group_by="segment")
                store.traffic_window(s, limit=200)
            loops += 1
        except Exception as exc:
            errors.append(repr(exc))
        time.sleep(0.02)
    out.put({"role": "reader", "loops": loops, "errors": errors})


def controller(url: str, seconds: float, versions: list[str], out: Any) -> None:
    from autospec import store

    engine = store.make_engine(url)
    logs = _watch_logs()
    moves, errors = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with store.session_scope(engine) as s:
                if store.acquire_lease(s, name="cycle", holder="ctl", ttl=timedelta(seconds=30)):
                    live = store.get_live(s)
                    first = live is None or live.version != versions[0]
                    nxt = versions[0] if first else versions[1]
                    store.set_live(s, version=nxt, actor="ctl", reason="test")
                    store.release_lease(s, name="cycle", holder="ctl")
                    moves += 1
        except Exception as exc:
            errors.append(repr(exc))
        time.sleep(0.1)
    out.put({"role": "controller", "moves": moves, "errors": errors, "locked": logs.count})

"""What every soak fault shares: the :class:`FaultContext` it may touch, the
:class:`FaultRecord` it returns, and the waits it times recovery with."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autospec.bench.soak import procs
from autospec.bench.soak.load import LoadGenerator
from autospec.bench.soak.storeview import StoreView


@dataclass
class FaultRecord:
    """One injected fault."""

    name: str
    at: float = 0.0
    recovery_s: float | None = None
    ok: bool | None = None
    skipped: str = ""
    detail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FaultContext:
    """What a fault may touch: the serve and controller processes, the load, the store."""

    base_url: str
    env: dict[str, str]
    logs: Path
    serve: procs.Child
    load: LoadGenerator
    view: StoreView
    data_dir: Path
    db_path: Path | None
    start_controller: Callable[[], procs.Child]
    controller: procs.Child | None = None
    say: Callable[[str], None] = print
    deadline: float = float("inf")


def wait_until(predicate: Callable[[], Any], deadline: float, step_s: float = 0.5) -> Any:
    """``predicate()``'s first truthy value, or None at ``deadline`` (epoch seconds)."""
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(step_s)
    return None


def first_answer_after(ctx: FaultContext, t: float, deadline: float) -> float | None:
    """Epoch time of the first request sent after ``t`` that was answered."""
    def found() -> float | None:
        done = [o.end for o in ctx.load.snapshot() if o.start > t and o.kind == "answered"]
        return min(done) if done else None
    return wait_until(found, deadline)

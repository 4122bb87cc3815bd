"""What a controller cycle reports: its :class:`CycleResult` (outcome, reasons, what it
trained, evaluated and promoted) and the outcome's exit code for ``autospec controller
once``; :class:`CycleFailed` stops a cycle with the reason it records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXIT_CODES = {"promoted": 0, "nothing_to_do": 0, "busy": 0, "rejected": 3, "failed": 2}


@dataclass
class CycleResult:
    """What a cycle (or an attempt at one) did."""

    outcome: str
    reasons: list[str] = field(default_factory=list)
    cycle_id: str | None = None
    window_key: str | None = None
    fresh_requests: int = 0
    candidates: list[str] = field(default_factory=list)
    bases: list[str] = field(default_factory=list)  # registered bases evaluated as they are
    evaluations: list[int] = field(default_factory=list)
    promoted: str | None = None
    incumbent: str | None = None
    # the promoted candidate's speedup over target-only as the gate saw it: "measured"
    # (interleaved decodes; None when measurement is off) and "estimated" (the cost model)
    promoted_speedup: dict[str, float | None] | None = None
    # per segment of the held-out window: what per-segment promotion did
    # (:class:`autospec.controller.segment_promotion.SegmentOutcome` as a dict)
    segments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "exit_code": self.exit_code}


class CycleFailed(RuntimeError):
    """The cycle cannot go on; the message is recorded as the reason."""

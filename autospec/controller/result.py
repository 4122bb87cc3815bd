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

    @property
    def headline(self) -> str:
        """The outcome and what moved: ``promoted segment json → v2`` (:func:`moves`)."""
        return headline(self.outcome, self.promoted, self.segments)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "exit_code": self.exit_code}


def moves(promoted: str | None, segments: list[dict[str, Any]]) -> list[str]:
    """What a cycle moved, in words: ``deployment → V`` when the deployment's pointer moved
    to V, then ``segment S → V`` for each segment pointer it moved (a cycle's ``segments``,
    as recorded: :class:`~autospec.controller.segment_promotion.SegmentOutcome` dicts)."""
    return ([f"deployment → {promoted}"] if promoted else []) + [
        f"segment {s['segment']} → {s['version']}" for s in segments
        if s.get("action") == "promoted"]


def headline(outcome: str, promoted: str | None, segments: list[dict[str, Any]]) -> str:
    """``promoted deployment → v1, segment json → v2``; any other outcome as it is."""
    moved = moves(promoted, segments)
    return f"{outcome} {', '.join(moved)}" if moved else outcome


class CycleFailed(RuntimeError):
    """The cycle cannot go on; the message is recorded as the reason."""

"""Traffic -> training sequences: a window from the store, split, with optional anchors.

A :class:`TrainingData` holds token sequences *prompt + output exactly as logged* (the
output is what the target produced), oldest first, split by time: the newest
``heldout_fraction`` of the window is held out for evaluation and never trained on.
Opted-out and redacted-without-ids rows never appear (the store's
:func:`~autospec.store.traffic_window` excludes them).

A window is chosen by time (``since``/``until``), by count (the newest ``limit``
requests), or both. *Anchors* are up to ``anchor_requests`` requests from before the
window (the train part of an older window), mixed into the train part so that a retrain
keeps what earlier traffic taught. This module knows nothing of models.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy.orm import Session

from autospec.store import TrafficExample, traffic_window
from autospec.train.errors import EmptyWindow, TrainingInputError, WindowTooSmall

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class TrainSequence:
    """One request as a training sequence."""

    ids: list[int]  # prompt + output token ids
    prompt_len: int  # the first prompt_len ids are the prompt
    request_id: int | None = None

    @property
    def output_len(self) -> int:
        return len(self.ids) - self.prompt_len


def documents(seqs: list[TrainSequence]) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, output ids)`` of each sequence (what a suffix index is built from)."""
    return [(s.ids[: s.prompt_len], s.ids[s.prompt_len :]) for s in seqs]


@dataclass(frozen=True)
class WindowSpec:
    """Which traffic to train on: a time range and/or the newest ``limit`` requests."""

    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None
    segment: str | None = None
    deployment: str | None = None
    heldout_fraction: float = 0.1
    anchor_requests: int = 0
    greedy_only: bool = False

    def describe(self) -> dict[str, object]:
        return {"since": _iso(self.since), "until": _iso(self.until), "limit": self.limit,
                "segment": self.segment, "heldout_fraction": self.heldout_fraction,
                "anchor_requests": self.anchor_requests}


@dataclass
class TrainingData:
    """Train and held-out sequences of one window, and where they came from."""

    train: list[TrainSequence]
    heldout: list[TrainSequence]
    anchors: int = 0  # how many of ``train`` are anchors from before the window
    start: datetime | None = None
    end: datetime | None = None
    split_at: datetime | None = None
    spec: WindowSpec = field(default_factory=WindowSpec)

    @property
    def train_tokens(self) -> int:
        return sum(len(s.ids) for s in self.train)

    def describe(self) -> dict[str, object]:
        return {**self.spec.describe(), "start": _iso(self.start), "end": _iso(self.end),
                "split_at": _iso(self.split_at), "train_requests": len(self.train),
                "heldout_requests": len(self.heldout), "anchor_requests": self.anchors,
                "train_tokens": self.train_tokens}


def parse_window(text: str, *, now: datetime | None = None) -> WindowSpec:
    """``"500"`` (the newest 500 requests), ``"24h"`` / ``"7d"`` / ``"30m"`` (that far back),
    or ``"7d:2000"`` (both)."""
    text = text.strip()
    duration, _, count = text.partition(":") if ":" in text else (
        ("", "", text) if text.isdigit() else (text, "", ""))
    since = None
    if duration:
        match = _DURATION.match(duration)
        if not match:
            raise TrainingInputError(
                f"bad window {text!r}: use a request count (500), a duration (24h, 7d, 30m) "
                f"or both (7d:500)")
        now = now or datetime.now(timezone.utc)
        since = now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    limit = None
    if count:
        if not count.isdigit() or int(count) < 1:
            raise TrainingInputError(f"bad window {text!r}: the request count must be >= 1")
        limit = int(count)
    return WindowSpec(since=since, limit=limit)


def load_training_data(session: Session, spec: WindowSpec, *,
                       min_requests: int = 1) -> TrainingData:
    """The window's sequences, split; :class:`EmptyWindow` / :class:`WindowTooSmall` if short."""
    window = traffic_window(session, since=spec.since, until=spec.until,
                            heldout_fraction=spec.heldout_fraction, limit=spec.limit,
                            deployment=spec.deployment, segment=spec.segment,
                            greedy_only=spec.greedy_only)
    train = [s for s in map(to_sequence, window.train) if s is not None]
    heldout = [s for s in map(to_sequence, window.heldout) if s is not None]
    if not train and not heldout:
        raise EmptyWindow(
            f"the window {_describe_spec(spec)} holds no usable request (none logged, or "
            f"all opted out or without token ids)")
    if len(train) < min_requests:
        raise WindowTooSmall(
            f"the window {_describe_spec(spec)} holds {len(train)} training requests "
            f"(+{len(heldout)} held out); the policy minimum is {min_requests}. Widen the "
            f"window or wait for more traffic.")
    anchors = _anchors(session, spec, window.start) if spec.anchor_requests else []
    log.info("window: %d train (+%d anchors), %d held out", len(train), len(anchors),
             len(heldout))
    return TrainingData(train=anchors + train, heldout=heldout, anchors=len(anchors),
                        start=window.start, end=window.end, split_at=window.split_at,
                        spec=spec)


def _anchors(session: Session, spec: WindowSpec, start: datetime | None) -> list[TrainSequence]:
    """Up to ``spec.anchor_requests`` requests from before ``start`` (never held-out ones)."""
    if start is None:
        return []
    older = traffic_window(session, until=start, heldout_fraction=0.0,
                           limit=spec.anchor_requests, deployment=spec.deployment,
                           segment=spec.segment, greedy_only=spec.greedy_only)
    return [s for s in map(to_sequence, older.train) if s is not None]


def to_sequence(example: TrafficExample) -> TrainSequence | None:
    """Prompt + output of one logged request; None without a prompt or an output."""
    if not example.prompt_ids or not example.output_ids:
        return None
    return TrainSequence(ids=[*example.prompt_ids, *example.output_ids],
                         prompt_len=len(example.prompt_ids), request_id=example.id)


def _describe_spec(spec: WindowSpec) -> str:
    parts = []
    if spec.since or spec.until:
        parts.append(f"[{_iso(spec.since) or '-inf'}, {_iso(spec.until) or 'now'})")
    if spec.limit:
        parts.append(f"newest {spec.limit}")
    if spec.segment:
        parts.append(f"segment {spec.segment!r}")
    return " ".join(parts) or "(all traffic)"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None

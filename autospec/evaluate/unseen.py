"""The logged requests a set of versions never trained on, so a shadow evaluation is held out.

A training run records its window (``metrics.window``: ``start``, ``split_at``, ``end``,
``segment``, ``anchor_requests``, ``synthetic_origins``): it trained on the window's requests
logged before ``split_at`` (every one up to ``end`` where nothing was held out), of
``segment`` only where the window named one, on up to ``anchor_requests`` older ones, and on
the prompts of the requests its synthetic sequences were resampled from (``autospec synth``:
any request, of any time or segment). A version fine-tuned from
a parent has seen its parent's requests too. :func:`unseen` drops each request some
evaluated version (or one of its ancestors) trained on: replaying a suffix index on the
answers it indexed gives a τ near k + 1 whatever it would do on new traffic, and a gate
that passes on it promotes a version nobody measured.

``autospec evaluate`` replays the newest requests of the deployment, which an ``autospec
train`` run just before may have trained on. The controller's cycle applies it too: its own
candidates train on the older part of the window whose newest part it evaluates on, so only
a version trained by hand (a live or segment version evaluated beside them) can take
requests out there.

This module reads the registry; it knows nothing of replay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.store.queries import TrafficExample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedOn:
    """The requests one training run of ``version`` (or of an ancestor, ``via``) trained on:
    logged at or after ``start`` (None: any older, anchors included) and before ``cut`` (or
    up to it, ``through``), of ``segment`` only where set."""

    version: str
    via: str
    start: datetime | None
    cut: datetime
    through: bool
    segment: str | None
    origins: frozenset[int] = frozenset()  # resampled into its synthetic sequences

    def covers(self, ex: TrafficExample) -> bool:
        if ex.id in self.origins:
            return True
        if self.segment is not None and ex.segment != self.segment:
            return False
        if self.start is not None and ex.created_at < self.start:
            return False
        return ex.created_at <= self.cut if self.through else ex.created_at < self.cut

    def describe(self) -> str:
        where = f" of segment {self.segment!r}" if self.segment else ""
        until = "up to" if self.through else "before"
        via = "" if self.via == self.version else f" (through its ancestor {self.via})"
        resampled = f" and {len(self.origins)} resampled into synthetic sequences" \
            if self.origins else ""
        return f"{self.version} trained on the requests{where} logged {until} " \
               f"{self.cut.isoformat(timespec='seconds')}{resampled}{via}"


def trained_on(db: Engine, versions: Sequence[str]) -> list[TrainedOn]:
    """What each of ``versions`` and its ancestors trained on, as far as their training runs
    recorded it (an imported or built-in version has no run: nothing)."""
    found: list[TrainedOn] = []
    with store.session_scope(db, readonly=True) as session:
        for version in versions:
            seen: set[str] = set()
            name: str | None = version
            while name is not None and name not in seen:
                seen.add(name)
                row = _speculator(session, name)
                if row is None:
                    break
                window = _window(session, row.training_run_id)
                if window is not None:
                    found.append(_trained(version, name, window))
                name = row.parent
    return found


def unseen(examples: list[TrafficExample], windows: list[TrainedOn]
           ) -> tuple[list[TrafficExample], dict[str, int]]:
    """``examples`` less those some window covers, and how many each version's windows took
    out (a request two versions trained on counts for both)."""
    kept: list[TrafficExample] = []
    dropped: dict[str, int] = {}
    for ex in examples:
        mine = {w.version for w in windows if w.covers(ex)}
        for version in mine:
            dropped[version] = dropped.get(version, 0) + 1
        if not mine:
            kept.append(ex)
    return kept, dropped


def held_out_only(db: Engine, versions: Sequence[str], examples: list[TrafficExample],
                  where: str) -> tuple[list[TrafficExample], dict[str, int], list[TrainedOn]]:
    """:func:`unseen` for ``versions``: the requests kept, how many each version's training
    took out, and the windows that took them; :class:`~autospec.evaluate.run.TrainedOnError`
    where ``examples`` (``where``: "the window '200'", say) held some and none is left."""
    from autospec.evaluate.run import TrainedOnError

    windows = trained_on(db, versions)
    kept, dropped = unseen(examples, windows)
    took = [w for w in windows if dropped.get(w.version)]
    if took:
        log.info("%s: %d of %d requests left out: %s", where, len(examples) - len(kept),
                 len(examples), "; ".join(w.describe() for w in took))
    if examples and not kept:
        raise TrainedOnError(
            f"every one of the {len(examples)} requests of {where} was trained on by a version "
            f"evaluated ({'; '.join(w.describe() for w in took)}): a replay of them would not "
            f"be held out. Send traffic after the newest training, then evaluate again")
    return kept, dropped, took


def _speculator(session: Any, version: str) -> Any:
    try:
        return store.get_speculator(session, version=version)
    except store.NotFound:
        return None  # built-in versions are not registered


def _window(session: Any, run_id: int | None) -> dict[str, Any] | None:
    """The run's recorded window, or one made of its columns for a run that recorded none."""
    if run_id is None:
        return None
    try:
        run = store.get_training_run(session, run_id=run_id)
    except store.NotFound:
        return None
    window = (run.metrics or {}).get("window")
    if isinstance(window, dict) and window.get("end"):
        return window
    if run.window_end is None:
        return None
    return {"end": run.window_end.isoformat()}  # no start, no split: everything up to its end


def _trained(version: str, via: str, window: dict[str, Any]) -> TrainedOn:
    split = window.get("split_at")
    anchors = bool(window.get("anchor_requests"))
    start = None if anchors or not window.get("start") else _when(window["start"])
    return TrainedOn(version=version, via=via, start=start,
                     cut=_when(split or window["end"]), through=split is None,
                     segment=window.get("segment"),
                     origins=frozenset(int(i) for i in window.get("synthetic_origins") or ()))


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text)

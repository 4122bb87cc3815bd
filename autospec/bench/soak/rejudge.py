"""``autospec bench soak-report DIR``: a finished soak's memory figures, its responses from a
version not live, and its verdict judged again, from the files the run left (``soak.json``,
``memory.jsonl``, ``requests.jsonl`` and its store under ``data/``), with this version's
rules: a rule fixed after a long run need not cost another run. Nothing but the report
(``soak.json``, ``soak.md``, ``soak.png``) is rewritten; what the run measured is read,
never changed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from autospec.bench.soak.figures import judge_memory, judge_not_live, verdict
from autospec.bench.soak.load import Outcome
from autospec.bench.soak.report import write_report
from autospec.bench.soak.storeview import StoreView


class NotASoak(ValueError):
    """``DIR`` lacks a file a soak leaves."""


def _need(path: Path) -> Path:
    if not path.is_file():
        raise NotASoak(f"{path} is missing: not a finished soak's directory "
                       "(autospec bench soak --out DIR leaves soak.json, memory.jsonl, "
                       "requests.jsonl and data/autospec.db)")
    return path


def _samples(path: Path) -> list[tuple[float, str, int]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            d = json.loads(line)
            out.append((float(d["t"]), str(d["process"]), int(d["rss"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise NotASoak(f"{path}:{n}: not a memory sample ({exc})") from None
    return out


def _outcomes(path: Path) -> list[Outcome]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(Outcome(**json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise NotASoak(f"{path}:{n}: not a request's outcome ({exc})") from None
    return out


def rejudge(out: Path) -> dict[str, Any]:
    """The run's figures with memory, not-live and verdict recomputed; the report
    rewritten."""
    if not out.is_dir():
        raise NotASoak(f"{out}: " + ("a file, not a soak's run directory" if out.exists()
                                     else "no such directory"))
    figures = _need(out / "soak.json")  # (a NotASoak, not re-worded as a parse error below)
    try:
        r = json.loads(figures.read_text())
        started, warmup_s = float(r["started"]), float(r["config"]["warmup_s"])
    except (ValueError, KeyError, TypeError) as exc:
        raise NotASoak(f"{figures}: not a soak's figures ({exc!r})") from None
    samples = _samples(_need(out / "memory.jsonl"))
    outcomes = _outcomes(_need(out / "requests.jsonl"))
    view = StoreView(f"sqlite:///{_need(out / 'data' / 'autospec.db')}")
    try:
        events = view.events()
    finally:
        view.close()
    # the run's own verdict, kept when a report already judged again is judged once more
    before = list(r["rejudged"]["verdict_before"] if "rejudged" in r else r.get("verdict", []))
    r["memory"] = judge_memory(samples, events, started, warmup_s)
    r["not_live"] = judge_not_live(outcomes, events, float(r["config"]["swap_grace_s"]))
    for move in r.get("pointer_moves", []):  # a report from before segments were shown
        move.setdefault("segment", None)
    r["verdict"] = verdict(r)
    r["rejudged"] = {"at": time.time(), "verdict_before": before}
    write_report(r, out)
    return r

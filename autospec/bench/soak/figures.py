"""All of a soak's figures in one JSON-able dict: the run's settings, the accounting
(:mod:`autospec.bench.soak.accounting`), the store's pointer moves and cycles, each fault,
memory, the shutdown, and the machine's load. ``verdict`` lists the goals missed."""

from __future__ import annotations

import platform
from collections import Counter, defaultdict
from typing import Any

from autospec.bench.soak import accounting as acc
from autospec.bench.soak.config import SoakConfig
from autospec.bench.soak.fault_context import FaultRecord
from autospec.bench.soak.load import Outcome
from autospec.bench.soak.storeview import StoreView, cycles, pointer_moves, refusals

#: memory growth after warm-up above this (%) is reported as a possible leak, for processes
#: of at least LEAK_MIN_MIB (a few MiB more in a 30 MiB helper is noise)
LEAK_PCT, LEAK_MIN_MIB = 5.0, 100.0
#: a controller whose memory samples stop this long before the run's (s) was killed
KILLED_MARGIN_S = 90.0


def figures(*, cfg: SoakConfig, t0: float, ended: float, startup_s: float,
            outcomes: list[Outcome], view: StoreView, faults: list[FaultRecord],
            samples: list[tuple[float, str, int]], shutdown: dict[str, Any], controllers: int,
            loadavg: list[tuple[float, float]], spill_files: int) -> dict[str, Any]:
    events = view.events()
    rows = view.rows()
    moves = pointer_moves(events)
    refused = refusals(events)
    kills = [f.at for f in faults if f.name.startswith("replica SIGKILL") and f.at]
    result: dict[str, Any] = {
        "config": cfg.model_dump(mode="json"), "started": t0, "ended": ended,
        "duration_s": round(ended - t0, 1), "startup_s": round(startup_s, 1),
        "machine": {"cpus": _cpus(), "python": platform.python_version(),
                    "loadavg_1min": [round(v, 2) for _, v in loadavg]},
        "requests": acc.counts(outcomes, kills),
        "rows": {**acc.rows_vs_answers(outcomes, rows, kills), "spill_files_left": spill_files},
        "not_live": judge_not_live(outcomes, events, cfg.swap_grace_s),
        "per_minute": acc.per_minute(outcomes, rows, t0),
        "memory": judge_memory(samples, events, t0, cfg.warmup_s),
        "faults": [f.as_dict() | {"at_s": round(f.at - t0, 1) if f.at else None} for f in faults],
        "pointer_moves": [{"at_s": round(m["at"] - t0, 1), "kind": m["kind"],
                           "version": m["version"], "from": m["from_version"],
                           "segment": (m.get("details") or {}).get("segment"),
                           "actor": m["actor"], "reason": m["reason"][:200]} for m in moves],
        "refusals": [{"at_s": round(e["at"] - t0, 1), "version": e["version"],
                      "actor": e["actor"], "reason": e["reason"][:300]} for e in refused],
        "cycles": _cycles(events, t0),
        "controllers_started": controllers,
        "shutdown": shutdown,
    }
    result["verdict"] = verdict(result)
    return result


def judge_not_live(outcomes: list[Outcome], events: list[dict[str, Any]],
                   swap_grace_s: float) -> list[dict[str, Any]]:
    """:func:`accounting.not_live` against every live pointer's timeline (the deployment's
    and each segment's), a refused version counting as the one kept."""
    refused: set[str] = set()
    by_segment: dict[str, set[str]] = defaultdict(set)
    for e in refusals(events):
        segment = e["details"].get("segment")
        (by_segment[segment] if segment else refused).add(e["version"])
    timelines = acc.allowed_timelines(pointer_moves(events), refused, by_segment)
    swaps = [e for e in events if e["kind"] == "swap"]
    starts = [span for tl in timelines.values() for span in acc.engine_starts(tl, swaps)]
    return acc.not_live(outcomes, timelines, swap_grace_s, starts)


def judge_memory(samples: list[tuple[float, str, int]], events: list[dict[str, Any]],
                 t0: float, warmup_s: float) -> dict[str, Any]:
    """:func:`accounting.memory` with each controller judged from its first cycle that
    trained, between its cycles, and, if it was killed before the run's end, up to its last
    finished cycle."""
    return acc.memory(samples, t0, warmup_s, controller_warm(events),
                      controller_killed_until(events, samples), controller_busy(events))


def _controller_name(actor: object) -> str | None:
    parts = str(actor).split(":")
    return f"controller[{parts[1]}]" if len(parts) >= 2 and parts[1].isdigit() else None


def controller_killed_until(events: list[dict[str, Any]],
                            samples: list[tuple[float, str, int]]) -> dict[str, float]:
    """``controller[PID]`` whose samples stop over KILLED_MARGIN_S before the run's last (a
    controller a fault killed) → the end of its last own cycle record, or of the run's start
    if it finished none: it died inside a cycle, and what it held then (the cycle's target
    features, its training) is not the floor between cycles the growth rule is after."""
    last_seen: dict[str, float] = {}
    for t, name, _ in samples:
        last_seen[name] = max(last_seen.get(name, t), t)
    run_last = max(last_seen.values(), default=0.0)
    ended: dict[str, float] = {}
    for e in events:
        name = _controller_name(e["actor"])
        if (name and e["kind"] == "note" and e["details"].get("type") == "cycle"
                and e["details"].get("outcome") != "interrupted"):
            ended[name] = max(ended.get(name, e["at"]), e["at"])
    first = min((t for t, _, _ in samples), default=0.0)
    return {name: ended.get(name, first - 120.0) for name, t in last_seen.items()
            if name.startswith("controller[") and t < run_last - KILLED_MARGIN_S}


def controller_busy(events: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """``controller[PID]`` → the spans of its cycles: from its ``cycle_start`` note to its own
    record of that cycle's end, or open-ended where it wrote none (it died in the cycle).
    Between them a controller holds only what it keeps (its target), which is what a leak
    would raise; inside them it holds the cycle's features, training and replay."""
    ends: dict[tuple[str, str], float] = {}
    starts: list[tuple[str, str, float]] = []
    for e in events:
        name, d = _controller_name(e["actor"]), e["details"]
        if name is None or e["kind"] != "note" or "cycle_id" not in d:
            continue
        if d.get("type") == "cycle_start":
            starts.append((name, d["cycle_id"], e["at"]))
        elif d.get("type") == "cycle":
            ends[(name, d["cycle_id"])] = e["at"]
    out: dict[str, list[tuple[float, float]]] = {}
    for name, cycle_id, at in starts:
        out.setdefault(name, []).append((at, ends.get((name, cycle_id), float("inf"))))
    return out


def controller_warm(events: list[dict[str, Any]]) -> dict[str, float]:
    """``controller[PID]`` → when its first cycle that got as far as training ended (its
    cycle record, whose actor is ``vm:PID:…``): the controller loads its target then and
    keeps it, so its memory is judged from there on. An ``interrupted`` record is another
    controller's verdict on a dead one's cycle and says nothing of the recorder's memory."""
    out: dict[str, float] = {}
    for e in events:
        if e["kind"] != "note" or e["details"].get("type") != "cycle":
            continue
        if e["details"].get("outcome") not in ("promoted", "rejected", "failed"):
            continue
        name = _controller_name(e["actor"])
        if name:
            out[name] = min(out.get(name, e["at"]), e["at"])
    return out


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def _cycles(events: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    recs = cycles(events)
    outcomes = Counter(c["outcome"] for c in recs)
    return {"outcomes": dict(outcomes),
            "promotions": sum(1 for e in events if e["kind"] == "promotion"),
            "overrides": sum(1 for e in events if e["kind"] == "override"),
            "rollbacks": sum(1 for e in events if e["kind"] == "rollback"),
            "failed": [{"at_s": round(c["at"] - t0, 1), "outcome": c["outcome"],
                        "reasons": [str(r)[:300] for r in c["reasons"][-3:]]}
                       for c in recs if c["outcome"] in ("failed", "interrupted")],
            "failure_events": [{"at_s": round(e["at"] - t0, 1), "actor": e["actor"],
                                "reason": e["reason"][:300]}
                               for e in events if e["kind"] == "failure"]}


def verdict(r: dict[str, Any]) -> list[str]:
    """The goals this run missed (empty: all met)."""
    missed = []
    req, rows = r["requests"], r["rows"]
    if req["failed_unexplained"]:
        missed.append(f"{req['failed_unexplained']} failed requests not explained by a fault")
    if rows["answered_without_row"]:
        missed.append(f"{rows['answered_without_row']} answered requests have no traffic row")
    if rows["duplicate_rows"]:
        missed.append(f"{rows['duplicate_rows']} duplicate traffic rows")
    if r["not_live"]:
        missed.append(f"{len(r['not_live'])} responses from a version that was not live")
    if r["shutdown"]["left_running"]:
        missed.append(f"processes left after SIGTERM: {r['shutdown']['left_running']}")
    for name, m in r["memory"].items():
        growth, last = m["growth_after_warmup_pct"], list(m["rss_mib_per_minute"].values())[-1]
        if growth is not None and growth > LEAK_PCT and last >= LEAK_MIN_MIB:
            missed.append(f"{name}: memory grew {growth}% after warm-up")
    for f in r["faults"]:
        if f["ok"] is False:
            missed.append(f"fault '{f['name']}' did not recover as it should")
    return missed

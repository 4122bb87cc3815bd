"""The demo's mixed traffic: per-segment versions against one deployment-wide version.

After B2, phase ``M1`` sends domains A and B alternating to the live app (each request's
``x-autospec-segment`` names its domain), all drafted by the deployment's live version; a
controller cycle with ``promotion.per_segment`` on then decides each segment on its own
held-out requests (:mod:`autospec.controller.segment_promotion`), and phase ``M2`` sends the
same mix again, each request drafted by its segment's version
(:meth:`autospec.serve.versions.VersionManager.for_segment`). This module turns ``M2`` into
the comparison "against one" (:func:`compare`):

- per segment, from the responses (:attr:`PhaseFigures.segments`): the version that served
  it (``x-autospec-speculator``), live τ, the speedup over target-only on its paired prompts;
- per segment, the **shadow τ** of (a) the version that served it and (b) the deployment's
  single live version, both replayed on the same logged ``M2`` rows of that segment
  (:func:`segment_shadow`; one target pass per row shared by both);
- the pointers as the store holds them after the cycle (:func:`read_pointers`), the audit
  log's segment moves, and the cycle's per-segment outcomes with their reasons — so a cycle
  that moved no segment pointer is reported as such, with the gate's reasons.

:func:`mix_lines` and :func:`mix_table` write it as markdown and a rich table. Nothing here
decides anything; the controller does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from autospec.demo.plan import DemoPlan
from autospec.demo.record import PhaseFigures, fmt
from autospec.demo.serving import DEPLOYMENT
from autospec.engine.stats import tau

if TYPE_CHECKING:
    from autospec.controller.cycle import CycleResult

#: a segment's shadow τ per version: version -> (τ, rows replayed)
Shadow = dict[str, tuple[float | None, int]]


def read_pointers(store_engine: Any) -> tuple[str, dict[str, str]]:
    """The deployment's live version (the built-in one while it has no pointer) and each
    segment's own pointer, from the store."""
    from autospec import store
    from autospec.versions import BUILTIN_VERSION

    with store.session_scope(store_engine, readonly=True) as session:
        live = store.get_live(session, deployment=DEPLOYMENT)
        own = {p.segment: p.version
               for p in store.list_segment_pointers(session, deployment=DEPLOYMENT)}
    return (live.version if live else BUILTIN_VERSION), own


def segment_moves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit log's moves of segment pointers (``details.segment`` set), oldest first."""
    return [{"at": e["at"], "kind": e["kind"], "segment": e["details"]["segment"],
             "version": e["version"], "from_version": e.get("from_version"),
             "actor": e["actor"], "reason": e["reason"]}
            for e in events if (e.get("details") or {}).get("segment")]


def segment_shadow(store_engine: Any, target: Any, plan: DemoPlan, phase: PhaseFigures,
                   versions: dict[str, list[str]], *,
                   wait: Callable[[], None]) -> dict[str, Shadow]:
    """Per segment of ``phase``: τ of each of ``versions[segment]`` replayed on the
    segment's newest logged rows of the phase (at most ``plan.shadow_sample``)."""
    from autospec.evaluate.replay import replay
    from autospec.evaluate.run import select_requests, to_replay_request
    from autospec.versions import load_speculator_version

    if phase.requests == 0:
        return {}
    wait()
    rows = select_requests(store_engine, last=phase.requests, deployment=DEPLOYMENT)
    loaded: dict[str, Any] = {}
    out: dict[str, Shadow] = {}
    for segment, names in versions.items():
        mine = [to_replay_request(r) for r in rows if r.segment == segment]
        mine = mine[-plan.shadow_sample:]
        if not mine:
            out[segment] = {n: (None, 0) for n in names}
            continue
        for name in names:
            if name not in loaded:
                loaded[name] = load_speculator_version(store_engine, target, name)[1]
        stats = replay(target, {n: loaded[n] for n in names}, mine, plan.k)
        out[segment] = {n: (tau(sum(s.accepted for s in stats[n]),
                                sum(s.steps for s in stats[n])), len(mine)) for n in names}
    return out


def compare(phase: PhaseFigures, *, deployment_version: str | None, pointers: dict[str, str],
            moves: list[dict[str, Any]], cycle: CycleResult | None,
            shadow: dict[str, Shadow]) -> dict[str, Any]:
    """The "against one" record of the mixed phase after the per-segment cycle."""
    rows = []
    for name, seg in phase.segments.items():
        mine = shadow.get(name, {})
        served = mine.get(seg.served_by or "", (None, 0))
        one = mine.get(deployment_version or "", (None, 0))
        rows.append({"segment": name, "served_by": seg.served_by, "own_pointer":
                     pointers.get(name), "requests": seg.requests, "tau_live": seg.tau_live,
                     "speedup": seg.speedup, "paired_prompts": seg.paired_prompts,
                     "replayed": max(served[1], one[1]), "shadow_served": served[0],
                     "shadow_one": one[0]})
    outcomes = list(cycle.segments) if cycle is not None else []
    return {"phase": phase.name, "deployment_version": deployment_version,
            "pointers": dict(pointers), "moves": moves, "segments": rows,
            "cycle": None if cycle is None else {"outcome": cycle.outcome,
                                                 "reasons": list(cycle.reasons)},
            "outcomes": outcomes, "note": _note(pointers, outcomes, cycle)}


def _note(pointers: dict[str, str], outcomes: list[dict[str, Any]],
          cycle: CycleResult | None) -> str:
    """What the per-segment cycle did, in one paragraph; why, where no pointer moved."""
    if cycle is None:
        return "no per-segment cycle ran before the mixed phase"
    moved = [o for o in outcomes if o.get("action") == "promoted"]
    if moved:
        return "the cycle moved " + "; ".join(
            f"segment {o['segment']!r} to {o['version']}" for o in moved)
    if outcomes:
        why = "; ".join(f"{o['segment']!r} {o['action']}: {o['reason']}" for o in outcomes)
        held = f" (pointers of earlier cycles: {pointers})" if pointers else ""
        return f"the cycle moved no segment pointer{held} — {why}"
    reasons = "; ".join(cycle.reasons[-3:]) or "none given"
    return (f"the cycle ({cycle.outcome}) decided no segment, so it moved no segment "
            f"pointer: {reasons}")


MIX_COLUMNS = ("segment", "served by", "own pointer", "requests", "τ live", "speedup",
               "replayed", "τ shadow: served", "τ shadow: one version", "served / one")


def mix_rows(mix: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in mix["segments"]:
        ratio = (r["shadow_served"] / r["shadow_one"]
                 if r["shadow_served"] and r["shadow_one"] else None)
        rows.append([r["segment"], r["served_by"] or "—", r["own_pointer"] or "follows",
                     str(r["requests"]), fmt(r["tau_live"]),
                     fmt(r["speedup"]) + ("×" if r["speedup"] else "")
                     + f" ({r['paired_prompts']})", str(r["replayed"]),
                     fmt(r["shadow_served"]), fmt(r["shadow_one"]), fmt(ratio)])
    return rows


def mix_lines(mix: dict[str, Any] | None) -> list[str]:
    """The report's section on the mixed phase (none without one)."""
    if not mix:
        return []
    lines = ["", f"## Mixed traffic ({mix['phase']}): per-segment versions against one", "",
             f"Deployment-wide live version: {mix['deployment_version'] or '—'}; segment "
             f"pointers in the store: {_pointers(mix['pointers'])}. "
             f"{mix['note'][0].upper() + mix['note'][1:]}.", "",
             "Shadow τ: the segment's logged rows of the phase replayed with the version that "
             "served it and with the deployment-wide one; speedup over target-only on the "
             "segment's paired prompts (their number in brackets).", "",
             "| " + " | ".join(MIX_COLUMNS) + " |", "|" + "---|" * len(MIX_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in mix_rows(mix)]
    if mix["moves"]:
        lines += ["", "Segment pointer moves (audit log):", ""]
        lines += [f"- {m['at']} {m['kind']} segment {m['segment']!r}: "
                  f"{m['from_version'] or '—'} → {m['version']} by {m['actor']}: {m['reason']}"
                  for m in mix["moves"]]
    return lines


def mix_table(mix: dict[str, Any]) -> Table:
    table = Table(title=Text(f"mixed traffic ({mix['phase']}): per-segment versions against "
                             f"one (deployment: {mix['deployment_version'] or '—'})",
                             style="table.title"),
                  caption=Text(mix["note"], style="table.caption"))
    for col in MIX_COLUMNS:
        table.add_column(col, justify="left" if col in MIX_COLUMNS[:3] else "right",
                         overflow="fold")
    for row in mix_rows(mix):
        table.add_row(*map(Text, row))
    return table


def _pointers(pointers: dict[str, str]) -> str:
    return ", ".join(f"{s} → {v}" for s, v in sorted(pointers.items())) or "none"

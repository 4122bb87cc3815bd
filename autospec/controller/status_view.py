"""``autospec status`` as rich tables: the live version, τ shadow and live, speed, the
policy in force, traffic, schedule, lease, canary, segment pointers, recent cycles and
failures. Reads the
dictionary :func:`autospec.controller.status.collect_status` builds; queries nothing. What
the store holds (names, reasons, paths, a policy's name) goes into the tables as rich
``Text``: printed as written, never read as markup."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autospec.controller.ledger_view import ledger_table
from autospec.controller.result import moves


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure with ``digits`` decimals, or ``—`` where there is none."""
    return "—" if value is None else f"{value:.{digits}f}"


def canary_text(canary: dict[str, Any] | None) -> str:
    """The pending canary's progress: requests compared (and those left out), τ, gain. With
    as many as the canary needs, the verdict is the next watch's (``controller watch``, or
    ``controller run`` between cycles); the policy's canary off, none comes."""
    if not canary:
        return "—"
    left_out, elsewhere = canary.get("left_out"), canary.get("on_segments_left_out")
    held = fmt(canary.get("shadow_tau_held_out"))  # the canary's shadow τ is at the live mix
    n, needed = canary["requests"], canary["needed"]
    if canary.get("judged") is False:
        counted, sep = f"{n} requests; no verdict will come: the policy's canary is off", "; "
    elif n >= needed:
        counted, sep = (f"{n} requests (≥ {needed} needed), verdict at the next "
                        "`controller watch`"), "; "
    else:
        counted, sep = f"{n} of {needed} requests", ", "
    return (f"{canary['version']}: {counted}"
            + (f" ({left_out} more not compared: served at another k than evaluated or cut "
               "by a concurrency band)" if left_out else "")
            + (f" ({elsewhere} more on segments with pointers of their own, left out of "
               f"both τ: {', '.join(canary.get('segments_left_out') or [])})"
               if elsewhere else "")
            + f"{sep}live τ {fmt(canary['live_tau'])} vs shadow {fmt(canary['shadow_tau'])}"
            + (f" at the live mix ({held} over the held-out mix)"
               if held not in ("—", fmt(canary["shadow_tau"])) else "")
            + ("" if canary.get("expected_speed_gain") is None else
               f"; measured speed gain {canary['expected_speed_gain']:.2f}×"))


def print_status(data: dict[str, Any], out: Console) -> None:
    """``data`` (:func:`autospec.controller.status.collect_status`) as tables on ``out``."""
    table = Table(title=Text(f"deployment {data['deployment']}", style="table.title"),
                  show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in _rows(data):
        table.add_row(name, Text(value) if isinstance(value, str) else value)
    out.print(table)
    if data.get("segments"):
        out.print(_segments(data["segments"]))
    out.print(_cycles(data["cycles"]))
    if data.get("ledger"):
        out.print(ledger_table(data["ledger"]))
    if data["failures"]:
        fails = Table(title="recent failures")
        for col in ("time", "actor", "version", "reason"):
            fails.add_column(col)
        for f in data["failures"]:
            fails.add_row(*map(Text, (str(f["time"]), f["actor"], str(f["version"] or "—"),
                                      f["reason"])))
        out.print(fails)


def _rows(data: dict[str, Any]) -> list[tuple[str, str | Text]]:
    """The deployment table's rows: what, and its value (a ``str`` printed as written)."""
    live = data["live"]
    numerics, tau, load = data["numerics"], data["tau"], data.get("concurrency")
    traffic, sched, lease = data["traffic"], data["schedule"], data["lease"]
    return [
        ("live pointer", live["version"]
         + (" (built-in, nothing promoted)" if not live["pointer"] else "")),
        ("served by replicas", _served_text(data["served"], live["version"])),
        ("target / dtype / engine", "— (no replica has started)" if not numerics else
         f"{numerics['target_id']} rev {numerics['revision']} / {numerics['dtype']}"
         f" / {numerics['engine']}"),
        ("previous", str(live.get("previous_version") or "—")),
        ("τ shadow / 1h / 24h", f"{fmt(tau['shadow'])} / {fmt(tau['live_1h'])} "
         f"({tau['requests_1h']} req) / {fmt(tau['live_24h'])} ({tau['requests_24h']} req)"),
        ("speedup est. / measured", _speedup_text(data.get("speedup"))),
        ("last evaluation τ real / synthetic", _evaluation_text(data.get("last_evaluation"))),
        ("in flight per replica, 1h", "— (no request recorded it)" if not load else
         f"p50 {load['p50']:.1f} / p90 {load['p90']:.1f} / max {load['max']:.1f} "
         f"({load['requests']} requests)"),
        *([("k per concurrency band", f"{numerics['k_bands']} (the policy's)")]
          if numerics and numerics.get("k_bands") else []),
        ("policy", _policy_text(data.get("policy_in_force"))),
        ("requests 1h / 24h / all",
         f"{traffic['last_hour']} / {traffic['last_day']} / {traffic['total']}"),
        ("fresh since last cycle", f"{data['fresh_requests']} (policy {data['policy']} needs "
         f"{data['min_fresh_requests']})"),
        ("next scheduled cycle", "—" if not sched else Text.assemble(
            f"{sched['next_run']} by {sched['holder']}",
            (" (overdue: no scheduler running?)" if sched["overdue"] else "", "red"),
            " (its cycle is running)" if sched.get("running") else "")),
        ("lease", "free" if not lease else
         f"{lease['holder']} (token {lease['token']}, until {lease['expires_at']})"),
        ("canary", canary_text(data["canary"])),
    ]


def _policy_text(info: dict[str, Any] | None) -> str:
    if not info:
        return "—"
    if info["origin"] == "recorded":
        return (f"{info['name']} from {info['source']} (recorded by {info['recorded_by']} "
                f"at {str(info['recorded_at'])[:19]})")
    if info["origin"] == "given":
        return f"{info['name']} from {info['source']} (--policy)"
    return f"{info['name']} (shipped default: no controller has recorded its policy yet)"


def _evaluation_text(ev: dict[str, Any] | None) -> str | Text:
    if not ev:
        return "— (no evaluation yet)"
    real = " / ".join(f"{v} {fmt(t)}" for v, t in ev["tau_real"].items())
    syn = ev["tau_synthetic"]
    synthetic = ("no synthetic sequences" if not syn else
                 " / ".join(f"{v} {fmt(t)}" for v, t in syn.items())
                 + f" ({ev['synthetic_sequences']} seq)")
    return Text.assemble(f"#{ev['evaluation_id']} {ev['decision']}: real {real}; synthetic "
                         f"{synthetic}",
                         ("; overfitting guard rejected it" if ev["overfits"] else "", "red"))


def _speedup_text(speed: dict[str, Any] | None) -> str:
    if not speed:
        return "— (no evaluation names the live version)"
    est, measured = speed["estimated"], speed["measured"]
    text = (f"{fmt(est, 2)}× / {fmt(measured, 2)}"
            + ("×" if measured is not None else " (not measured)"))
    return text + f" over target-only (evaluation #{speed['evaluation_id']})"


def _served_text(served: dict[str, Any], pointer: str) -> str | Text:
    if not served["versions"]:
        return "— (no replica reported in the last minute)"
    n = served["replicas"]
    return Text.assemble(
        f"{', '.join(served['versions'])} ({n} replica{'' if n == 1 else 's'} reporting)",
        ("" if served["agrees"] else f" — not the pointer's {pointer}: see recent failures",
         "red"))


def _segments(segments: list[dict[str, Any]]) -> Table:
    table = Table(title="segment pointers (other segments: the live pointer's version)")
    for col in ("segment", "version", "since", "previous", "by", "drafted by it"):
        table.add_column(col)
    for s in segments:
        refused = s.get("refused")
        table.add_row(*map(Text, (s["segment"], s["version"], str(s["since"])[:19],
                                  str(s["previous_version"] or "—"), s["updated_by"])),
                      Text("yes") if refused is None else Text(f"no — {refused}", style="red"))
    return table


def _cycles(cycles: list[dict[str, Any]]) -> Table:
    table = Table(title="recent cycles")
    for col in ("started", "trigger", "window", "outcome", "moved", "reasons"):
        table.add_column(col)
    for c in cycles:
        reasons = [r if len(r) <= 90 else r[:89] + "…" for r in c["reasons"][-2:]]
        moved = moves(c["promoted"], c["segments"])  # the deployment's pointer, segments'
        table.add_row(*map(Text, (str(c["started_at"])[:19], str(c["trigger"]),
                                  str(c["window_key"]), c["outcome"],
                                  "\n".join(moved) or "—", "\n".join(reasons))))
    return table

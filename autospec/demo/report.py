"""The demo's report: a rich table per phase, the decisions, a PNG chart, JSON, Markdown.

- :func:`phase_table` — live version, τ live and shadow, tokens/s, speedup over
  target-only (paired prompts), requests, time;
- :func:`write_chart` — τ of every live response over time, one colour per speculator
  version, a rolling mean per version, the phases shaded and labelled, controller decisions
  marked (matplotlib, Agg backend: no display needed);
- :func:`speed_table` — each promotion's speedup as the gate expected it (measured and
  estimated) against what the next phase realised, and whether it is within 25 %;
- :func:`~autospec.demo.mix.mix_lines` — the mixed phase after the per-segment cycle: per
  segment the version that served it, live τ, speedup, and the shadow τ of that version
  against the deployment's single one on the same rows; the segment pointers and why;
- :func:`write_json` — the phase figures, decisions, speed checks, the mixed phase's
  comparison (``mix``), audit events and every sample;
- :func:`write_markdown` — the same tables as ``report.md`` next to the chart.

A partial result (the run was interrupted or failed: ``result.partial`` says why) is
reported the same way, marked partial everywhere: the table's title, a note at the top of
``report.md`` (which phase did not finish), ``"complete": false`` in the JSON, the chart's
title. Reads a :class:`~autospec.demo.record.DemoResult`; measures nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table
from rich.text import Text

from autospec.controller.ledger_view import ledger_markdown
from autospec.demo.concurrency import concurrency_lines
from autospec.demo.mix import mix_lines
from autospec.demo.record import DemoResult, PhaseFigures, fmt
from autospec.demo.speed_checks import TOLERANCE, speed_checks
from autospec.jsonout import json_default

COLUMNS = ("phase", "traffic", "live version", "τ live", "τ shadow", "tok/s",
           "target-only tok/s", "speedup", "requests", "time s")


def phase_row(p: PhaseFigures) -> list[str]:
    versions = ", ".join(f"{v} ({n})" for v, n in p.versions.items()) \
        if len(p.versions) > 1 else (p.live_version or "—")
    return [p.name, p.domain, versions, fmt(p.tau_live), fmt(p.tau_shadow),
            fmt(p.tokens_per_s, ".1f"), fmt(p.target_tokens_per_s, ".1f"),
            fmt(p.speedup, ".2f") + ("×" if p.speedup else ""),
            f"{p.requests}" + (f" ({p.errors} failed)" if p.errors else ""),
            f"{p.end_t - p.start_t:.0f}"]


def partial_note(result: DemoResult) -> str | None:
    """One line on what a partial report lacks (None for a complete run)."""
    if result.partial is None:
        return None
    done = [p.name for p in result.phases]
    unfinished = [name for name in dict.fromkeys(s.phase for s in result.samples)
                  if name not in done]
    note = (f"partial report: {result.partial}; phases finished: "
            f"{', '.join(done) if done else 'none'}")
    if unfinished:
        n = sum(1 for s in result.samples if s.phase in unfinished and s.app == "live")
        note += (f"; phase {', '.join(unfinished)} did not finish (its {n} live responses are "
                 f"in the chart and the JSON, not in the table)")
    return note


def phase_table(result: DemoResult) -> Table:
    note = partial_note(result)
    table = Table(title=Text(f"autospec demo ({result.plan['mode']}, {result.target}, "
                             f"{result.plan.get('engine', 'native')} engine) — "
                             f"{result.took_s / 60:.1f} min"
                             + (" — PARTIAL" if result.partial is not None else ""),
                             style="table.title"),
                  caption=None if note is None else Text(note, style="table.caption"))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("phase", "traffic", "live version")
                         else "right")
    for p in result.phases:
        table.add_row(*map(Text, phase_row(p)))
    return table


def decision_table(result: DemoResult) -> Table:
    table = Table(title="controller decisions")
    for col in ("t s", "after", "what", "version", "reasons"):
        table.add_column(col, overflow="fold")
    for d in result.decisions:
        table.add_row(*map(Text, (f"{d.t:.0f}", d.after_phase, d.outcome, d.version or "—",
                                  "\n".join(d.reasons) or "—")))
    return table


SPEED_COLUMNS = ("promoted", "after", "gate: measured", "gate: estimated", "realised in",
                 "realised", "gate / realised", f"within {TOLERANCE:.0%}")


def speed_rows(result: DemoResult) -> list[list[str]]:
    """Each promotion's expected speedup against the realised one (demo/speed_checks.py)."""
    return [[c["version"], c["after_phase"], _x(c["measured"]), _x(c["estimated"]),
             c["realised_in"] or "—", _x(c["realised"]), fmt(c["gate_over_realised"]),
             "—" if c["within"] is None else ("yes" if c["within"] else "no")]
            for c in speed_checks(result)]


def _x(value: float | None) -> str:
    return fmt(value) + ("×" if value is not None else "")


def speed_table(result: DemoResult) -> Table:
    table = Table(title="speed: what the gate expected, what the next phase realised")
    for col in SPEED_COLUMNS:
        table.add_column(col, justify="left" if col in ("promoted", "after", "realised in")
                         else "right")
    for row in speed_rows(result):
        table.add_row(*map(Text, row))
    return table


def swap_lines(events: list[dict]) -> list[str]:
    """The replicas' swaps (vLLM: in place or a new engine, how long, why), as markdown."""
    swaps = [e for e in events if e["kind"] == "swap"]
    if not swaps:
        return []
    lines = ["", "## Swaps in the serving engine", "",
             "| at | from | to | how | seconds | why |", "|---|---|---|---|---|---|"]
    for e in swaps:
        d = e.get("details") or {}
        lines.append(f"| {e['at']} | {e.get('from_version') or '—'} | {e['version']} | "
                     f"{d.get('mode', '—')} | {fmt(d.get('seconds'))} | {d.get('why') or '—'} |")
    return lines


def write_json(result: DemoResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.as_dict(), indent=2, default=json_default) + "\n",
                    encoding="utf-8")


def write_markdown(result: DemoResult, path: Path, chart: Path | None) -> None:
    note = partial_note(result)
    lines = [f"# autospec demo ({result.plan['mode']})" + (" — partial" if note else ""), ""]
    if note:
        lines += [f"> **{note[0].upper() + note[1:]}.**", ""]
    lines += [f"Target `{result.target}` on the {result.plan.get('engine', 'native')} engine, "
              f"{result.plan['max_tokens']} tokens per request, "
              f"k = {result.plan['k']}, greedy; took {result.took_s / 60:.1f} minutes. "
              f"Speedup: output tokens/s of the live app over the target-only app on the same "
              f"prompts (every {result.plan['baseline_every']}th prompt of a phase, sent to "
              f"both back to back)."
              + (f" eagle3 candidates warm-started from base {result.base}."
                 if result.base else ""), "",
              "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(phase_row(p)) + " |" for p in result.phases]
    lines += ["", "## Controller decisions", ""]
    for d in result.decisions:
        named = f" {d.version}" if d.version else ""
        lines.append(f"- **{d.outcome}**{named} (t = {d.t:.0f} s, after {d.after_phase})")
        lines += [f"  - {r}" for r in d.reasons]
    speed = speed_rows(result)
    if speed:
        lines += ["", "## Speed: the gate's figure against the realised one", "",
                  "| " + " | ".join(SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in speed]
    lines += mix_lines(result.mix)
    lines += swap_lines(result.events) + concurrency_lines(result.concurrency)
    lines += ledger_markdown(result.ledger)
    lines += ["", "## Audit log (pointer moves and notes)", ""]
    lines += [f"- {e['at']} {e['kind']} {e['version'] or ''} by {e['actor']}: {e['reason']}"
              for e in result.events]
    if chart is not None:
        lines += ["", f"![τ over time]({chart.name})"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_chart(result: DemoResult, path: Path) -> Path:
    """τ per live response over time, coloured by version; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = [s for s in result.samples if s.app == "live" and s.ok and s.tau is not None]
    versions = list(dict.fromkeys(s.version or "?" for s in live))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(11, 5), dpi=110)
    for i, p in enumerate(result.phases):
        ax.axvspan(p.start_t, p.end_t, color="0.93" if i % 2 else "0.97", zorder=0)
        ax.text((p.start_t + p.end_t) / 2, 1.0, f"{p.name}\n{p.domain}", ha="center",
                va="bottom", fontsize=8, transform=ax.get_xaxis_transform(), clip_on=False)
    for i, version in enumerate(versions):
        pts = [s for s in live if (s.version or "?") == version]
        xs, ys = [s.t for s in pts], [s.tau for s in pts]
        ax.scatter(xs, ys, s=14, color=colours(i), alpha=0.55, label=version)
        ax.plot(xs, _rolling(ys, 6), color=colours(i), linewidth=2)
    for d in result.decisions:
        if d.outcome in ("promoted", "drift", "rolled_back"):
            ax.axvline(d.t, color="black" if d.outcome == "promoted" else "crimson",
                       linestyle="--", linewidth=1)
            ax.text(d.t, 0.02 if d.outcome == "promoted" else 0.55, f" {d.outcome}",
                    rotation=90, fontsize=8, va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("τ per request (accepted + 1 per step)")
    ax.set_ylim(bottom=1.0)
    if live:
        ax.legend(title="speculator version", loc="upper left", fontsize=8)
    if result.partial is not None:
        ax.set_title(f"partial: {result.partial}", fontsize=9, loc="left", pad=22)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _rolling(values: list[float], n: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - n + 1): i + 1]
        out.append(sum(window) / len(window))
    return out

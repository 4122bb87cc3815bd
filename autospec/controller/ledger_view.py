"""The ledger (:mod:`autospec.ledger`) drawn: a rich table for ``autospec
status`` and ``autospec ledger`` (its names and notes as rich ``Text``: printed as written,
never read as markup), markdown lines for the demo's report. Queries nothing."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.table import Table
from rich.text import Text

COLUMNS = ("segment", "requests", "tokens", "decode s", "target-only s", "saved s",
           "loop s", "net s")


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _row(line: dict[str, Any]) -> list[str]:
    return [str(line["segment"]), str(line["requests"]), str(line["tokens"]),
            _s(line["decode_s"]), _s(line["baseline_s"]), _s(line["saved_s"]),
            _s(line["loop_s"]), _s(line["net_s"])]


def rows(ledger: dict[str, Any]) -> list[list[str]]:
    """One row per segment, then the total."""
    return [_row(line) for line in ledger["segments"]] + [_row(ledger["total"])]


def period_text(seconds: float) -> str:
    """A period as read: minutes under an hour ("18.8 min"), else hours to three figures
    ("24 h"; the demo's ledger read "last 0.312904 h")."""
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.3g} h"


def window_text(ledger: dict[str, Any]) -> str:
    """"last 24 h" for a period that ends now (within a minute), else the period and its end:
    "10.0 min to 2026-12-07 06:00 UTC" (``autospec ledger --until``)."""
    until = ledger.get("until")
    if isinstance(until, str):
        until = datetime.fromisoformat(until)
    period = period_text(ledger["period_s"])
    if not isinstance(until, datetime) or abs(
            (datetime.now(timezone.utc) - until).total_seconds()) <= 60:
        return f"last {period}"
    return f"{period} to {until.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC"


def rate_source(rate: dict[str, Any]) -> str:
    """Where R came from: the period's held-out requests or the gate's evaluations."""
    if rate.get("source") == "holdout":
        return f"{rate['requests']} held-out requests of the period"
    return f"{rate['engine']}, evaluations {', '.join(f'#{i}' for i in rate['evaluations'])}"


def summary(ledger: dict[str, Any]) -> str:
    """One line: the period, R, the loop's cycles and stages, whether it paid."""
    rate, loop = ledger["target_only"], ledger["loop"]
    stages = ", ".join(f"{k} {v:,.0f}" for k, v in loop["stages"].items() if v >= 0.5)
    cycles = f"{loop['cycles']} cycle{'s' * (loop['cycles'] != 1)}" + (
        f" (+{loop['interrupted']} interrupted, time unknown)" if loop.get("interrupted") else "")
    paid = {None: "not known", True: "yes", False: "no"}[ledger["pays"]]
    rate_text = ("target-only rate not measured" if rate is None else
                 f"target-only {rate['tokens_per_s']:.1f} tokens/s ({rate_source(rate)})")
    return (f"{window_text(ledger)}; {rate_text}; loop: {cycles}, "
            f"{loop['seconds']:,.0f} s ({stages or 'no stage timings'}); "
            f"paid for itself: {paid}" + (f" — {ledger['note']}" if ledger["note"] else ""))


def ledger_table(ledger: dict[str, Any]) -> Table:
    """The ledger as a rich table, its summary as the caption."""
    table = Table(title=Text(f"ledger of {ledger.get('deployment', '')}: decode time saved "
                             "by speculation vs the loop's time", style="table.title"),
                  caption=Text(summary(ledger), style="table.caption"))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "segment" else "right")
    for row in rows(ledger):
        table.add_row(*map(Text, row))
    return table


def ledger_markdown(ledger: dict[str, Any] | None) -> list[str]:
    """The ledger as a markdown section (none: no lines)."""
    if not ledger:
        return []
    lines = ["", "## Ledger: did the loop pay for itself?", "", summary(ledger) + ".", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows(ledger)]

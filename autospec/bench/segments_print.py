"""The tables ``autospec bench segments`` prints from its report, and the same as markdown
(``--output``): both arms per segment and over the mix, the goal's verdict, what each
candidate measured when the versions were picked. Reads the report; measures nothing."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from autospec.bench.segments_ledger import ledger_text
from autospec.bench.segments_measure import GLOBAL, SEGMENT, TARGET_ONLY
from autospec.bench.train_print import tau_text

HEAD = ("segment", "requests", "global version", "segment version", "τ global", "τ segment",
        "target-only tok/s", "global tok/s (speedup)", "segment tok/s (speedup)",
        "segment ÷ global")


def arm_rows(report: dict) -> list[list[str]]:
    """One row per segment, then ``mix``: both arms' figures on the same requests."""
    measured = report["measured"]
    groups = {**measured["segments"], "mix": measured["overall"]}
    rows = []
    for name, g in groups.items():
        a = g["arms"]
        rows.append([name, str(g["requests"]), ", ".join(a[GLOBAL]["versions"]),
                     ", ".join(a[SEGMENT]["versions"]), tau_text(a[GLOBAL]["tau"]),
                     tau_text(a[SEGMENT]["tau"]), f"{a[TARGET_ONLY]['tokens_per_s']:.1f}",
                     _speed(a[GLOBAL]), _speed(a[SEGMENT]), f"{g['segment_over_global']:.2f}×"])
    return rows


def _speed(arm: dict) -> str:
    return f"{arm['tokens_per_s']:.1f} ({arm['speedup']:.2f}×)"


def verdict(report: dict) -> str:
    """The goal in one line: reached or not, with the figures it rests on."""
    g = report["goal"]
    line = (f"goal (segment ÷ global ≥ {g['mix_goal']:.2f}× over the mix, never < 1.00× on "
            f"a segment): {'reached' if g['reached'] else 'NOT reached'} — mix "
            f"{g['mix_ratio']:.2f}×, worst segment {g['worst_segment_ratio']:.2f}×")
    same = same_version_segments(report)
    if same:
        line += (f"; {', '.join(same)}: the same version in both arms, so the ratio there is "
                 "the bench's noise")
    return line


def same_version_segments(report: dict) -> list[str]:
    """Segments whose global and segment arms decoded with the same version(s)."""
    return [name for name, g in report["measured"]["segments"].items()
            if g["arms"][GLOBAL]["versions"] == g["arms"][SEGMENT]["versions"]]


def pick_rows(report: dict) -> list[list[str]]:
    """Each segment's candidates and the speedup each measured on its picking prompts."""
    picks = report["picks"]
    rows = [[GLOBAL, "every segment", picks[GLOBAL]["version"], _speedups(
        picks[GLOBAL]["speedup"])]]
    for name, p in picks["segments"].items():
        rows.append([name, str(p["prompts"]), p["version"], _speedups(p["speedup"])])
    return rows


def _speedups(speedup: dict[str, float]) -> str:
    return ", ".join(f"{v} {s:.2f}×" for v, s in speedup.items())


PICK_HEAD = ("for", "prompts", "picked", "decoded speedup of each candidate")


def print_report(report: dict) -> None:
    """The report's tables on the console."""
    from rich.console import Console

    console = Console()
    for title, head, rows in ((_title(report), HEAD, arm_rows(report)),
                              ("versions picked (the gate's measurement)", PICK_HEAD,
                               pick_rows(report))):
        table = Table(title=Text(title, style="table.title"))
        for col in head:
            table.add_column(col, justify="left" if col in ("segment", "for") else "right")
        for row in rows:
            table.add_row(*map(Text, row))
        console.print(table)
    console.print(Text(verdict(report)))
    console.print(Text(ledger_text(report["ledger_check"])))
    console.print(Text(ledger_text(report["ledger_check_holdout"])))


def _title(report: dict) -> str:
    return (f"held-out requests of {', '.join(report['domains'])}: one global version vs a "
            f"version per segment (greedy, k={report['k']}, {report['dtype']}, "
            f"{report['threads']} threads)")


def markdown(report: dict) -> str:
    """The tables as markdown, with the verdict."""
    lines = [f"# bench segments: {report['target']}", "", _title(report) + ":", "",
             *_md_table(HEAD, arm_rows(report)), "", verdict(report), "",
             ledger_text(report["ledger_check"]), "",
             ledger_text(report["ledger_check_holdout"]), "",
             "Versions picked (the gate's measurement, on other held-out requests):", "",
             *_md_table(PICK_HEAD, pick_rows(report)), ""]
    return "\n".join(lines)


def _md_table(head: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *["| " + " | ".join(row) + " |" for row in rows]]


def write_markdown(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(report))

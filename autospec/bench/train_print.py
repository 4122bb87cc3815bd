"""The tables ``autospec bench train`` prints from its report: every method on the
held-out requests, the training of each kind, the eagle3 variants side by side (with the
other domain), and the target's verify cost. Reads the report; measures nothing. A τ that
is None (a method that took no step) reads ``—``.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text


def print_report(report: dict) -> None:
    """The report's tables on the console."""
    from rich.console import Console

    console = Console()
    table = Table(title=Text(f"held-out {report['domain']} requests "
                             f"({report['eval_requests']}, greedy, k={report['k']}, "
                             f"{report['dtype']}), side by side", style="table.title"))
    for col in ("method", "τ", "tokens/s", "speedup", "identical", "draft ms/step",
                "step ms"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, r in report["methods"].items():
        table.add_row(*map(Text, (name, tau_text(r["tau"]), f"{r['tokens_per_s']:.1f}",
                                  f"{r['speedup']:.2f}×", str(r["identical_outputs"]),
                                  f"{r['draft_ms_per_step']:.1f}", f"{r['step_ms']:.1f}")))
    console.print(table)
    train = Table(title="training (one run each; from scratch except eagle3-base+finetune)")
    for col in ("kind", "wall s", "features s", "train s", "examples", "held-out top-1 before → "
                "after (per TTT step)"):
        train.add_column(col)
    for kind, t in report["training"].items():
        before, after = t.get("heldout_before"), t.get("heldout_after")
        acc = "—"
        if before and after:
            acc = " ".join(f"{b:.2f}→{a:.2f}" for b, a in zip(before["accuracy"],
                                                             after["accuracy"], strict=True))
        elif t.get("replay_tau"):
            acc = f"replay τ {t['replay_tau']:.2f}"
        train.add_row(*map(Text, (kind, f"{t['wall_s']:.0f}", f"{t['feature_s'] or 0:.0f}",
                                  f"{t['train_s'] or 0:.0f}", str(t["examples_seen"]), acc)))
    console.print(train)
    if len(report.get("by_variant", {})) > 1 or "other_domain" in report:
        console.print(_variant_table(report))
    console.print(Text("target forward of n tokens vs 1: " + ", ".join(
        f"n={n}: {ms:.1f} ms ({report['verify_ratio'][n]:.2f}×)"
        for n, ms in report["verify_ms"].items())))


def _variant_table(report: dict) -> Table:
    """The eagle3 variants side by side: in-domain τ and speedup, ratios to scratch, and τ on
    the other domain against ngram's there."""
    other = report.get("other_domain")
    title = f"eagle3 variants on held-out {report['domain']} requests"
    if other:
        ngram = tau_text(other["methods"]["ngram"]["tau"])
        title += f"; {other['domain']} ({other['eval_requests']} prompts, ngram τ {ngram})"
    table = Table(title=Text(title, style="table.title"))
    cols = ["variant", "τ", "speedup", "τ / scratch", "speed / scratch"]
    if other:
        cols += [f"τ {other['domain']}", f"τ / ngram {other['domain']}"]
    for col in cols:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for variant, r in report["by_variant"].items():
        row = [variant, tau_text(r["tau"]), f"{r['speedup']:.2f}×",
               _ratio(r.get("tau_vs_scratch")), _ratio(r.get("speedup_vs_scratch"))]
        if other:
            row += [tau_text(r["other_tau"]), _ratio(r.get("other_tau_vs_ngram"))]
        table.add_row(*map(Text, row))
    return table


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def tau_text(tau: float | None) -> str:
    """τ to two decimals; ``—`` where none was measured (no step)."""
    return "—" if tau is None else f"{tau:.2f}"

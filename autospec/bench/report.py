"""Rich tables for benchmark results (reporters only read what benchmarks measured; names
and paths as rich ``Text``: printed as written, never read as markup)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()


def print_decode_report(section: dict) -> None:
    table = Table(title=Text(f"decode benchmark ({section['dtype']}), speedup vs engine "
                             "target-only", style="table.title"))
    for col in ("run", "tokens/s", "τ", "speedup", "lossless", "agreement"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in section["runs"]:
        tau = "—" if r["tau"] is None else f"{r['tau']:.2f}"
        table.add_row(*map(Text, (r["name"], f"{r['tokens_per_s']:.1f}", tau,
                                  f"{r['speedup']:.2f}×", "yes" if r["lossless"] else "NO",
                                  f"{r['agreement']:.0%}")))
    console.print(table)
    for r in section["runs"]:
        for d in r["divergences"]:
            tie = "near-tie" if d["near_tie"] else "NOT a near-tie"
            console.print(Text(f"  {r['name']}: diverges at token {d['position']} "
                               f"(top-2 margin {d['margin']:.4f}, ulp {d['ulp']:.4f}: {tie})"))
    cost = Table(title=Text(f"target forward cost ({section['dtype']}): n new tokens vs 1",
                            style="table.title"))
    cost.add_column("n", justify="right")
    cost.add_column("ms", justify="right")
    cost.add_column("× 1-token step", justify="right")
    for n, ms in section["verify_cost_ms"].items():
        cost.add_row(str(n), f"{ms:.1f}", f"{section['verify_cost_ratio'][n]:.2f}")
    console.print(cost)

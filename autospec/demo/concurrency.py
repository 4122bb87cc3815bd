"""The concurrency table of ``autospec demo --engine vllm``: speculation on and off at 1, 4
and 8 clients on the served engine, for the version live at the end of the run.

Once the story is over, the demo's two applications are still up: ``live`` (speculation on,
the version the controller left live, on the vLLM engine the replica runs) and ``target``
(speculation off). :func:`measure_concurrency` sends them what ``autospec bench serve
--engine vllm --concurrency 1,4,8`` sends its ``vllm/spec`` and ``vllm/off`` applications,
with the same function (:func:`autospec.bench.serve_engines.measure_loads`): greedy chats of
the last phase's domain (prompts of their own seed, not the demo's), that many clients at a
time, interleaved rounds. The quick demo keeps it short (1 and 4 clients, one round); the
full one measures 1, 4 and 8 clients, two rounds. :func:`concurrency_summary` turns the
figures into the table's rows (throughput with speculation over without, per load) and says
where speculation stops paying; :func:`concurrency_lines` writes them as Markdown.

The ``live`` application logs what it serves, so these requests are rows of the demo's store
too (after every phase: no figure of the story reads them). The native engine has no such
table: its replica decodes one request at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: clients per phase and interleaved rounds, per demo mode
CLIENTS = {"quick": (1, 4), "full": (1, 4, 8)}
ROUNDS = {"quick": 1, "full": 2}
#: seed of the table's prompts: not the demo's traffic (seed 0), as ``bench serve --domain``
PROMPT_SEED = 7919
PROMPTS = 6


def measure_concurrency(*, live_url: str, baseline_url: str, domain: str, clients: tuple[int, ...],
                        rounds: int, max_tokens: int, model: str | None = None,
                        say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The live application (speculation on) against the target-only one, one phase per
    count in ``clients``; :func:`concurrency_summary` of the figures, with the settings."""
    from autospec.bench.progress import BenchProgress
    from autospec.bench.serve_engines import measure_loads
    from autospec.workloads import domain_prompts

    if say is not None:
        say(f"concurrency table: speculation on and off at {', '.join(map(str, clients))} "
            f"clients, {rounds} round{'s' * (rounds > 1)}, {max_tokens} tokens per request")
    bodies = [{"messages": m, "max_tokens": max_tokens, "temperature": 0,
               **({"model": model} if model else {})}
              for m in domain_prompts(domain, PROMPTS, seed=PROMPT_SEED)]
    progress = BenchProgress("demo concurrency", {}, None)
    phases = measure_loads({"vllm/spec": live_url, "vllm/off": baseline_url}, bodies, rounds,
                           list(clients), progress)
    return {"domain": domain, "rounds": rounds, "max_tokens": max_tokens,
            **concurrency_summary(phases)}


def concurrency_summary(phases: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Rows per client count (the live version, its τ, throughput on and off, on ÷ off) and
    the lowest count at which speculation is slower than target-only (None: nowhere)."""
    rows = []
    for clients in sorted(phases):
        on, off = phases[clients]["vllm/spec"], phases[clients]["vllm/off"]
        rows.append({"clients": clients, "version": ",".join(on["versions"]), "tau": on["tau"],
                     "spec_tok_s": on["throughput_tok_s"], "off_tok_s": off["throughput_tok_s"],
                     "on_over_off": on["throughput_tok_s"] / off["throughput_tok_s"]})
    stops = next((r["clients"] for r in rows if r["on_over_off"] < 1.0), None)
    return {"rows": rows, "stops_paying_at": stops}


COLUMNS = ("clients", "live version", "τ", "spec on tok/s", "spec off tok/s", "on ÷ off")


def concurrency_rows(table: dict[str, Any]) -> list[list[str]]:
    """The table's cells, one list per client count."""
    return [[str(r["clients"]), r["version"] or "—",
             "—" if r["tau"] is None else f"{r['tau']:.2f}", f"{r['spec_tok_s']:.1f}",
             f"{r['off_tok_s']:.1f}", f"{r['on_over_off']:.2f}×"] for r in table["rows"]]


def verdict(table: dict[str, Any]) -> str:
    """Where speculation stops paying, in words."""
    at = table["stops_paying_at"]
    loads = ", ".join(str(r["clients"]) for r in table["rows"])
    return (f"speculation stops paying at {at} clients" if at is not None
            else f"speculation pays at every load measured ({loads} clients)")


def concurrency_lines(table: dict[str, Any] | None) -> list[str]:
    """The report's section (Markdown lines; none without a table)."""
    if not table:
        return []
    lines = ["", "## Speculation at the load served (vLLM)", "",
             f"Throughput (all completion tokens over the batch's wall time) of the live app "
             f"against the target-only app, {table['max_tokens']} greedy tokens per request of "
             f"{table['domain']}, {table['rounds']} interleaved round(s) per load; "
             f"{verdict(table)}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(row) + " |" for row in concurrency_rows(table)]


def concurrency_table(table: dict[str, Any]) -> Any:
    """The same table for the console (rich)."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=Text(f"speculation at the load served (vLLM): {verdict(table)}",
                           style="table.title"))
    for col in COLUMNS:
        out.add_column(col, justify="left" if col == "live version" else "right")
    for row in concurrency_rows(table):
        out.add_row(*map(Text, row))
    return out

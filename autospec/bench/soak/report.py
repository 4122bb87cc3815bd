"""The soak's report under ``--out``: ``soak.json`` (every figure), ``soak.md`` (tables a
person reads in a minute) and ``soak.png`` (latency, τ and memory per minute, the faults
marked; matplotlib, Agg backend). The runner also leaves the raw data beside them:
``requests.jsonl`` (every request's outcome) and ``memory.jsonl`` (every sample)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

#: processes drawn in the memory panel (the rest are in the JSON)
DRAWN = ("serve", "replica", "controller", "serve-proxy", "serve-controller", "raylet",
         "gcs_server")


def write_report(r: dict[str, Any], out: Path) -> None:
    (out / "soak.json").write_text(json.dumps(r, indent=2) + "\n")
    (out / "soak.md").write_text(markdown(r))
    chart(r, out / "soak.png")


def markdown(r: dict[str, Any]) -> str:
    req, rows, cfg = r["requests"], r["rows"], r["config"]
    load = r["machine"]["loadavg_1min"]
    lines = [
        f"# Soak: {cfg['engine']} engine, {cfg['target']}, {r['duration_s'] / 60:.1f} min at "
        f"{cfg['rate']} req/s",
        "",
        f"Verdict: **{'all goals met' if not r['verdict'] else 'goals missed'}**",
        *[f"- {m}" for m in r["verdict"]],
        *_rejudged(r),
        "",
        f"Machine: {r['machine']['cpus']} CPUs; 1-min load average during the run "
        f"{min(load, default=0):.1f}–{max(load, default=0):.1f}. Serve ready after "
        f"{r['startup_s']:.0f}s.",
        "",
        "| requests | count |", "|---|---|",
        f"| sent | {req['sent']} |", f"| answered | {req['answered']} |",
        f"| latency p50 / p99 (s) | {req['latency_p50_s']} / {req['latency_p99_s']} |",
        f"| hung up on purpose | {req['disconnected_on_purpose']} |",
        *[f"| failed: {k} | {v} |" for k, v in req["failed_by_kind"].items()],
        f"| failed, cut by a replica SIGKILL | {req['failed_explained_by_replica_kill']} |",
        f"| **failed, unexplained** | **{req['failed_unexplained']}** |",
        f"| traffic rows (matched) | {rows['rows']} |",
        f"| answered, row lost with a SIGKILLed replica | "
        f"{rows.get('row_lost_at_replica_kill', 0)} |",
        f"| **answered without a row, unexplained** | **{rows['answered_without_row']}** |",
        f"| rows of hung-up / failed requests | {rows['rows_without_answer_by_client_outcome']} |",
        f"| duplicate rows | {rows['duplicate_rows']} |",
        f"| responses from a version not live | {len(r['not_live'])} |",
        f"| spill files left | {rows['spill_files_left']} |",
        "",
        *_faults(r), "", *_cycles(r), "", *_memory(r), "", *_minutes(r), "",
        f"Shutdown (SIGTERM): serve exited {_exit(r['shutdown']['serve_exit_s'])}; "
        f"processes left: {r['shutdown']['left_running'] or 'none'} "
        f"(of {r['shutdown']['processes_seen']} seen).", "",
    ]
    return "\n".join(lines)


def _exit(seconds: float | None) -> str:
    return "only when killed" if seconds is None else f"after {seconds:.1f} s"


def _rejudged(r: dict[str, Any]) -> list[str]:
    if "rejudged" not in r:
        return []
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["rejudged"]["at"]))
    before = r["rejudged"]["verdict_before"]
    return ["", f"Memory, answers from a version not live and verdict judged again from the "
            f"run's files at {when} UTC "
            f"(`autospec bench soak-report`); the run's own verdict: "
            f"{'; '.join(before) if before else 'all goals met'}."]


def _faults(r: dict[str, Any]) -> list[str]:
    out = ["| fault | at | ok | recovery | what was seen |", "|---|---|---|---|---|"]
    for f in r["faults"]:
        at = "—" if f["at_s"] is None else f"{f['at_s'] / 60:.1f} min"
        ok = "skipped" if f["skipped"] else ("yes" if f["ok"] else "**no**")
        rec = "—" if f["recovery_s"] is None else f"{f['recovery_s']:.1f} s"
        seen = "; ".join(f["detail"]) or f["skipped"]
        out.append(f"| {f['name']} | {at} | {ok} | {rec} | {seen.replace('|', '/')[:400]} |")
    return out


def _segment(move: dict[str, Any]) -> str:
    return f" (segment {move['segment']})" if move.get("segment") else ""


def _cycles(r: dict[str, Any]) -> list[str]:
    c = r["cycles"]
    out = [f"Cycles: {c['outcomes'] or 'none'}; promotions {c['promotions']}, operator "
           f"overrides {c['overrides']}, rollbacks {c['rollbacks']}.", "",
           "| pointer move | at | version | from | actor | reason |", "|---|---|---|---|---|---|"]
    out += [f"| {m['kind']}{_segment(m)} | {m['at_s'] / 60:.1f} min | {m['version']} | "
            f"{m['from']} | "
            f"{m['actor']} | {m['reason'][:120]} |" for m in r["pointer_moves"]]
    if c["failed"]:
        out += ["", "Failed / interrupted cycles:"]
        out += [f"- {f['at_s'] / 60:.1f} min {f['outcome']}: {'; '.join(f['reasons'])[:300]}"
                for f in c["failed"]]
    return out


def _memory(r: dict[str, Any]) -> list[str]:
    """One row per process judged for growth; the short-lived ones (vLLM engines a speed
    measurement started and closed, a killed replica or controller) one row per kind."""
    out = ["| process | RSS first → last (MiB) | growth after warm-up |", "|---|---|---|"]
    brief: dict[str, list[float]] = {}
    for name, m in r["memory"].items():
        values = list(m["rss_mib_per_minute"].values())
        if not values or values[-1] < 50:
            continue  # small helpers: in the JSON
        growth = m["growth_after_warmup_pct"]
        if growth is None:
            brief.setdefault(name.rsplit("[", 1)[0], []).append(max(values))
            continue
        where = " between cycles" if m.get("between_cycles_mib_per_minute") else ""
        out.append(f"| {name} | {values[0]:.0f} → {values[-1]:.0f} | {growth:+.1f} %{where} |")
    for kind, peaks in sorted(brief.items()):
        out.append(f"| {kind} ×{len(peaks)}, each too short-lived to judge | largest "
                   f"{max(peaks):.0f} | — |")
    return out


def _minutes(r: dict[str, Any]) -> list[str]:
    out = ["| minute | answered | failed | p50 s | p99 s | τ |", "|---|---|---|---|---|---|"]
    out += [f"| {m['minute']} | {m['answered']} | {m['failed']} | {m['p50_s']} | {m['p99_s']} "
            f"| {m['tau']} |" for m in r["per_minute"]]
    return out


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = r["per_minute"]
    xs = [m["minute"] + 0.5 for m in minutes]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(xs, [m["p50_s"] for m in minutes], label="p50")
    axes[0].plot(xs, [m["p99_s"] for m in minutes], label="p99")
    axes[0].set_ylabel("latency (s)")
    axes[1].plot(xs, [m["tau"] for m in minutes], color="tab:green")
    axes[1].set_ylabel("τ (rows)")
    for name, m in r["memory"].items():
        if name.split("[")[0] in DRAWN:
            per = m["rss_mib_per_minute"]
            axes[2].plot([int(k) + 0.5 for k in per], list(per.values()), label=name)
    axes[2].set_ylabel("RSS (MiB)")
    axes[2].set_xlabel("minute")
    for f in r["faults"]:
        if f["at_s"] is not None:
            for ax in axes:
                ax.axvline(f["at_s"] / 60, color="red", alpha=0.4, linestyle="--")
            axes[0].annotate(f["name"][:28], (f["at_s"] / 60, 0), rotation=90, fontsize=7,
                             xycoords=("data", "axes fraction"), va="bottom")
    for ax in (axes[0], axes[2]):
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"soak: {r['config']['engine']}, {r['config']['target']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

"""``autospec loadgen``: drive a running deployment with domain traffic (or a replay file).

Prints a progress line while it runs and a summary table at the end: failed requests counted
by kind, each kind with its first message (what the server or the connection said); the
by-version table says how many requests straddled an in-place swap (drafted by several
versions, counted once under the response's version). ``--json PATH`` also writes the
summary and, with ``--per-request``, every request. Exit status 0 when every request
succeeded, 1 when some failed, 2 for a usage error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from autospec.durations import parse_span
from autospec.json_file import json_file_option

log = logging.getLogger(__name__)


def loadgen(
    url: Annotated[str, typer.Option(
        help="the deployment's base URL (the OpenAI API is at URL/v1)")] = "http://127.0.0.1:8000",
    concurrency: Annotated[int, typer.Option(min=1, help="clients sending at once")] = 1,
    rate: Annotated[float | None, typer.Option(
        help="requests per second at most (default: as fast as the clients go)")] = None,
    duration: Annotated[str | None, typer.Option(
        help="stop after this long: seconds, or with a unit (90s, 5m, 2h)")] = None,
    requests: Annotated[int | None, typer.Option(
        min=1, help="stop after this many requests (default 20 when no --duration)")] = None,
    mix: Annotated[str, typer.Option(
        help="domain weights, e.g. support=0.7,coding=0.3 (domains: support, coding, "
        "json/extraction)")] = "support=1",
    schedule: Annotated[str | None, typer.Option(
        help="mix over time, overrides --mix: '0:support=1;120:coding=1' (seconds from the start) "
        "or a YAML file of {at, mix} steps")] = None,
    replay: Annotated[Path | None, typer.Option(
        help="JSONL of prompts to send instead of domain prompts: a string per line, or "
        "{messages|prompt, segment?, max_tokens?, temperature?}")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens per request")] = 64,
    temperature: Annotated[float, typer.Option(
        min=0.0, help="sampling temperature (0: greedy)")] = 0.0,
    model: Annotated[str | None, typer.Option(
        help="model name (default: the first one served)")] = None,
    seed: Annotated[int, typer.Option(help="prompt draw and mix seed")] = 0,
    timeout: Annotated[float, typer.Option(
        min=0.001, help="seconds per request before it counts as failed")] = 300.0,
    api_key: Annotated[str | None, typer.Option(
        show_default=False,
        help="the deployment's API key, sent as 'Authorization: Bearer' (default: the first "
        "key of AUTOSPEC_API_KEY, else of AUTOSPEC_API_KEY_FILE, as `autospec serve` reads "
        "them)")] = None,
    json_path: Annotated[Path | None, json_file_option("write the summary here (a JSON file)")
                         ] = None,
    per_request: Annotated[bool, typer.Option(
        help="with --json (refused without it): include every request")] = False,
    stream: Annotated[bool, typer.Option(
        help="stream each request (stream_options.include_usage) and report the time to "
        "first token and output tokens/s after it")] = False,
) -> None:
    """Send OpenAI API traffic of chosen domains to a deployment and summarise it.

    Exit 0: every request succeeded; 1: some failed, or the server did not answer; 2: a
    usage error."""
    from autospec.loadgen.client import Driver
    from autospec.loadgen.mix import MixError, Schedule, parse_mix, parse_schedule
    from autospec.loadgen.runner import LoadSpec, run_load, summarize
    from autospec.loadgen.source import DomainSource, ReplaySource, SourceError, known_domains

    if per_request and json_path is None:
        raise typer.BadParameter("needs --json FILE: the requests are written there",
                                 param_hint="--per-request")
    if requests is None and duration is None:
        requests = 20
    duration_s = parse_span(duration, "--duration", "s").total_seconds() if duration else None
    _check_url(url)
    option = "--schedule" if schedule else "--mix"  # each error names its option
    try:
        known = known_domains()
        plan = parse_schedule(schedule, known=known) if schedule \
            else Schedule.constant(parse_mix(mix, known=known))
        option = "--replay"
        source: Any = ReplaySource(replay) if replay else DomainSource(seed=seed)
        option = "--rate"  # the only setting LoadSpec checks that typer's bounds do not
        spec = LoadSpec(schedule=plan, concurrency=concurrency, rate=rate,
                        requests=requests, duration_s=duration_s, seed=seed)
    except (MixError, SourceError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
    driver = Driver(url, model=model, max_tokens=max_tokens, temperature=temperature,
                    timeout_s=timeout, api_key=api_key, stream=stream)
    _check_reachable(driver)
    what = f"replay of {replay}" if replay else plan.describe()
    typer.echo(f"loadgen → {driver.url} ({driver.model}): {what}; concurrency {concurrency}, "
               f"rate {rate or 'max'}/s, " + (f"{requests} requests" if requests else "")
               + (f" within {duration_s:g}s" if duration_s else ""))
    counter = _Counter()
    started = time.perf_counter()
    results = run_load(spec, source, driver, on_result=counter.add,
                       stop=threading.Event())
    summary = summarize(results, time.perf_counter() - started)
    summary.update(url=driver.url, model=driver.model, schedule=what,
                   max_tokens=max_tokens, temperature=temperature, concurrency=concurrency,
                   rate=rate)
    _print(summary)
    if json_path is not None:
        out = dict(summary, results=[r.as_dict() for r in results]) if per_request else summary
        json_path.write_text(json.dumps(out, indent=2) + "\n")
    if summary["errors"]:
        raise typer.Exit(1)


def _check_url(url: str) -> None:
    """An http(s) URL with a host, or a usage error naming it (not 'cannot reach /v1')."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(f"{url!r} is not an http:// or https:// URL with a host",
                                 param_hint="--url")


def _check_reachable(driver: Any) -> None:
    import openai

    try:
        driver.model  # noqa: B018 — resolves the served model name; fails fast when down
    except (openai.OpenAIError, RuntimeError) as exc:
        typer.echo(f"cannot reach {driver.url}/v1/models: {type(exc).__name__}: {exc}",
                   err=True)
        raise typer.Exit(1) from None


class _Counter:
    """A running count printed every few seconds (thread-safe)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.ok = self.failed = 0
        self.every_s, self.last = every_s, time.perf_counter()
        self.lock = threading.Lock()

    def add(self, result: Any) -> None:
        with self.lock:
            if result.ok:
                self.ok += 1
            else:
                self.failed += 1
            now = time.perf_counter()
            if now - self.last >= self.every_s:
                self.last = now
                typer.echo(f"  {self.ok} ok, {self.failed} failed", err=True)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _print(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()  # what the server answered (error kinds, versions) as written
    console.print(Text(
        f"requests {summary['requests']} (errors {summary['errors']}"
        + (f": {summary['error_kinds']}" if summary["errors"] else "") + f") in "
        f"{summary['wall_s']:.1f}s — {summary['requests_per_s']:.2f} req/s, "
        f"{summary['tokens_per_s']:.1f} output tokens/s, p50 {_fmt(summary['p50_ms'], '.0f')} "
        f"ms, p99 {_fmt(summary['p99_ms'], '.0f')} ms, τ {_fmt(summary['tau'])}"
        + ("" if summary["ttft_p50_ms"] is None else
           f"; streamed: time to first token p50 {summary['ttft_p50_ms']:.0f} ms, "
           f"{_fmt(summary['decode_tokens_per_s'], '.1f')} tokens/s per request after it")))
    for kind, message in summary["error_messages"].items():
        console.print(Text(f"  {kind} × {summary['error_kinds'][kind]}: {message or '—'}"),
                      soft_wrap=True)  # one line each, as the JSON has it
    straddled = summary["straddled"]
    for key, title in (("by_version", "speculator version"), ("by_segment", "segment")):
        table = Table(title=f"by {title}")
        extra = ("straddled",) if straddled and key == "by_version" else ()
        for col in (title, "requests", "τ", "p50 ms", "output tokens", *extra):
            table.add_column(col, justify="left" if col == title else "right")
        for name, row in summary[key].items():
            table.add_row(*map(Text, (name, str(row["requests"]), _fmt(row["tau"]),
                                      f"{row['p50_ms']:.0f}", str(row["completion_tokens"]),
                                      *(str(row["straddled"]) for _ in extra))))
        console.print(table)
    if straddled:
        console.print(Text(
            f"{straddled} request(s) straddled a swap (drafted by more than one version: "
            "drafted_by in --per-request rows), each counted once, under its response's "
            "version"))

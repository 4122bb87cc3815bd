"""``autospec demo``: run the loop end to end on the embedded default and write a report.

Writes into ``--out`` (default: a fresh ``autospec-demo-<time>`` directory under the
current one): ``data/`` (the SQLite store and speculator artifacts of this run),
``report.md``, ``tau.png`` and ``demo.json`` (or ``--json PATH``).

Ctrl-C or a failure mid-run: Serve and Ray are shut down, the same report is written for
the phases finished so far, marked partial with the reason (a failure's traceback goes to
``traceback.txt`` next to it), and the command ends with one line on stderr and exit status
130 (interrupted) or 1 (failed); no traceback on the terminal.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from autospec.demo.plan import PRESETS
from autospec.json_file import json_file_option

log = logging.getLogger(__name__)
_QUICK, _FULL = PRESETS["quick"], PRESETS["full"]  # the help states their sizes


def _checked_out(value: Path | None) -> Path | None:
    """``--out`` is a folder or can be made one: a file there (or in place of a folder above
    it) is a usage error before anything runs."""
    if value is None:
        return None
    there = value
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise typer.BadParameter(f"{there} is a file; --out names the report's directory")
    return value


def demo(
    quick: Annotated[bool, typer.Option(
        "--quick", help=f"the short variant ({_QUICK.requests_per_phase} requests of "
        f"{_QUICK.max_tokens} tokens a phase: 7.4 minutes measured on 2 idle CPU cores, 18 on "
        f"vLLM) instead of the full one ({_FULL.requests_per_phase} of {_FULL.max_tokens}: "
        "10.7-17.3 minutes; README)")] = False,
    out: Annotated[Path | None, typer.Option(
        callback=_checked_out,
        help="report directory (default: ./autospec-demo-<time>); its data/ holds the "
        "store")] = None,
    json_path: Annotated[Path | None, json_file_option(
        "write the phase figures here (default: OUT/demo.json)")] = None,
    target: Annotated[str, typer.Option(
        help="target: a name, a directory or a .gguf")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(
        help="target dtype for serving and the controller: float32, bfloat16 or auto (bfloat16 "
        "where the CPU has it)")] = "auto",
    requests_per_phase: Annotated[int | None, typer.Option(
        min=4,
        help=f"requests per phase (default: {_QUICK.requests_per_phase} quick, "
        f"{_FULL.requests_per_phase} full)")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        min=1, help=f"tokens per request (default: {_QUICK.max_tokens} quick, "
        f"{_FULL.max_tokens} full)")] = None,
    domain_a: Annotated[str, typer.Option(help="the first traffic domain")] = "json",
    domain_b: Annotated[str, typer.Option(help="the domain traffic shifts to")] = "support",
    engine: Annotated[str, typer.Option(
        help="serving engine: native (autospec's; suffix and eagle3 candidates), vllm (vLLM's "
        "async engine; suffix candidates as autospec's proposer, eagle3 as chains, swapped "
        "in place) or auto (vllm on a CUDA GPU with vLLM installed, else native)")] = "auto",
    base: Annotated[str, typer.Option(
        help="the base eagle3 head the demo's eagle3 candidates warm-start from: auto (the "
        "newest autospec pretrain head for the target, in any dtype, in your store, "
        "AUTOSPEC_DATABASE_URL; none there: from scratch, and the demo says how to build "
        "one), none (from scratch) or a version name in your store")] = "auto",
) -> None:
    """Serve, send traffic, let the controller retrain and promote, shift the traffic, show
    τ drop, the drift trigger, the retrain and the recovery, then mix both domains on
    per-segment versions; report what was measured."""
    from rich.console import Console

    from autospec.demo.plan import plan_for
    from autospec.demo.run import DemoStopped, run_demo
    from autospec.engine.choice import (
        ENGINES,
        EngineUnavailable,
        check_vllm_installed,
        resolve_engine,
    )
    from autospec.settings import get_settings

    _check_domains(domain_a, domain_b)
    if engine not in ("auto", *ENGINES):
        raise typer.BadParameter(f"--engine must be auto, native or vllm, not {engine!r}")
    _check_target(target, dtype)
    resolved = resolve_engine(engine)
    if resolved == "vllm":
        try:
            check_vllm_installed()
        except EngineUnavailable as exc:
            raise typer.BadParameter(str(exc)) from None
    _check_base(base)
    plan = plan_for("quick" if quick else "full").with_overrides(
        requests_per_phase=requests_per_phase, max_tokens=max_tokens, domain_a=domain_a,
        domain_b=domain_b).on_engine(resolved)
    out = out or Path.cwd() / time.strftime("autospec-demo-%Y%m%d-%H%M%S")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # unwritable, say
        raise typer.BadParameter(f"{out}: {exc.strerror or exc}", param_hint="--out") from None
    console = Console()
    console.print(Text.assemble(
        ("autospec demo", "bold"), f" ({plan.mode}): {target} on the {plan.engine} engine, "
        f"{plan.requests_per_phase} requests per phase, {plan.max_tokens} tokens each, "
        f"candidates {', '.join(plan.kinds)}; report in {out}"))
    err = Console(stderr=True)
    try:
        try:
            result = run_demo(plan, data_dir=out / "data", target=target, dtype=dtype,
                              reporter=ConsoleReporter(console), base=base,
                              base_store=get_settings().resolved_database_url)
        except DemoStopped as stop:
            _stopped(stop, out, json_path, console, err)
        _report(result, out, json_path, console)
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down or writing the report
        err.print("[bold red]interrupted[/] (again): the report may be incomplete")
        raise typer.Exit(130) from None


def _check_domains(domain_a: str, domain_b: str) -> None:
    """Two known domains (each error naming its option), not the same prompts."""
    from autospec.loadgen.source import SourceError, canonical

    names = []
    for option, domain in (("--domain-a", domain_a), ("--domain-b", domain_b)):
        try:
            names.append(canonical(domain))
        except SourceError as exc:
            raise typer.BadParameter(str(exc), param_hint=option) from None
    if names[0] == names[1]:  # an alias is the same prompts under another segment name
        same = "" if domain_a == domain_b else f" ({domain_a}, {domain_b}: both {names[0]})"
        raise typer.BadParameter(f"--domain-a and --domain-b must differ{same}: the demo "
                                 "shifts the traffic from one to the other")


def _check_target(target: str, dtype: str) -> None:
    """``--target`` names a target and ``--dtype`` is one the replicas take, before Ray
    starts (exit 2 if not)."""
    from autospec.engine.target import TargetLoadError, check_dtype, check_spec

    try:
        check_dtype(dtype)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from None
    try:
        check_spec(target)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--target") from None


def _check_base(base: str) -> None:
    """A named ``--base`` must be a base eagle3 head in the user's store (exit 2 if not)."""
    from autospec.demo.base import BaseUnavailable, check_named
    from autospec.settings import get_settings
    from autospec.store import StoreError

    try:
        check_named(get_settings().resolved_database_url, base)
    except (BaseUnavailable, StoreError) as exc:
        raise typer.BadParameter(str(exc).splitlines()[0], param_hint="--base") from None


def _report(result, out: Path, json_path: Path | None, console) -> None:  # type: ignore[no-untyped-def]
    """Write the chart, JSON and Markdown; print the tables and where they are."""
    from autospec.demo.report import (
        decision_table,
        phase_table,
        speed_rows,
        speed_table,
        write_chart,
        write_json,
        write_markdown,
    )

    chart = write_chart(result, out / "tau.png")
    write_json(result, json_path or out / "demo.json")
    write_markdown(result, out / "report.md", chart)
    console.print(phase_table(result))
    if result.decisions:
        console.print(decision_table(result))
    if speed_rows(result):
        console.print(speed_table(result))
    if result.mix:
        from autospec.demo.mix import mix_table

        console.print(mix_table(result.mix))
    if result.concurrency:
        from autospec.demo.concurrency import concurrency_table

        console.print(concurrency_table(result.concurrency))
    console.print(Text(f"chart: {chart}\nreport: {out / 'report.md'}\nfigures: "
                       f"{json_path or out / 'demo.json'}"))


def _stopped(stop, out: Path, json_path: Path | None, console, err) -> None:  # type: ignore[no-untyped-def]
    """The partial report of a run that ended early, one line on stderr, exit 130 or 1."""
    if stop.__cause__ is not None:
        (out / "traceback.txt").write_text("".join(traceback.format_exception(stop.__cause__)),
                                           encoding="utf-8")
    where = "no report written"
    try:
        _report(stop.result, out, json_path, console)
        where = f"partial report in {out / 'report.md'}"
    except Exception as exc:  # the run's failure is the news; a report that fails is a note
        log.warning("the partial report could not be written: %s", exc)
    extra = f"; traceback in {out / 'traceback.txt'}" if stop.__cause__ is not None else ""
    err.print(Text.assemble((f"demo {stop.result.partial or ''}", "bold red"),
                            f"; {where}{extra}"), soft_wrap=True)
    raise typer.Exit(130 if stop.interrupted else 1)


class ConsoleReporter:
    """Draws the demo's progress with rich: a message as written (a ``str`` is never read
    as markup; a ``Text`` brings its own styles)."""

    def __init__(self, console, every: int = 4) -> None:  # type: ignore[no-untyped-def]
        self.console, self.every = console, every
        self.started = time.perf_counter()

    def say(self, message: str | Text) -> None:
        self.console.print(Text.assemble((f"{time.perf_counter() - self.started:6.0f}s", "dim"),
                                         " ", message))

    def request(self, phase, sample) -> None:  # type: ignore[no-untyped-def]
        if phase.requests % self.every == 0 or not sample.ok:
            status = (f"τ {sample.tau:.2f}", "") if sample.ok and sample.tau else ("failed", "red")
            self.say(Text.assemble(f"  {phase.name} {phase.requests:3d} requests — last: ",
                                   status, f" on {sample.version}, {sample.tokens} tokens in "
                                   f"{sample.latency_s:.1f}s"))

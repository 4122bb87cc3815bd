"""``autospec evaluate``: shadow-evaluate versions on logged traffic; a table or ``--json``.

What it is doing goes to stderr whether or not ``--json`` is given (stdout is then the JSON
document alone): the gate in force, the requests left out, and the replay's and the speed
measurement's progress — rich's bars on a terminal, else a line per tenth done."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table
from rich.text import Text

from autospec.cli_options import deployment_name
from autospec.controller.cli import POLICY_HELP, DbUrl, _errors
from autospec.json_file import checked_json_file
from autospec.jsonout import json_default
from autospec.names import DEFAULT_DEPLOYMENT

out = Console()
err = Console(stderr=True)


def parse_window(text: str) -> dict:
    """``500`` (the newest 500 requests), a duration ``24h`` / ``90m`` / ``7d``, or both
    (``7d:500``, as ``autospec train --window`` reads it)."""
    from autospec.durations import parse_duration

    span, _, count = text.strip().rpartition(":")
    if not count.isdigit() and not span:
        return {"since": parse_duration(text, "--window")}
    if not count.isdigit() or int(count) < 1:
        raise typer.BadParameter(f"{text!r}: the window's request count must be at least 1 "
                                 "(a window is 500, 24h or 7d:500)", param_hint="--window")
    return {"last": int(count), **({"since": parse_duration(span, "--window")} if span else {})}


def evaluate(
    versions: Annotated[list[str], typer.Argument(
        help="candidate first, then the incumbent (and any others); one version: compared with "
        "the live one")],
    window: Annotated[str, typer.Option(
        help="requests to replay: the newest N, a duration such as 24h, or both (7d:500); "
        "those a version evaluated (or its parent) trained on are left out")] = "200",
    target: Annotated[str | None, typer.Option(
        help="the target the versions were built for (default: what the deployment's "
        "replicas serve, else smollm2-135m)")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="target dtype for replay (default: the deployment's, so shadow τ is measured "
        "in the numerics served; another one is refused)")] = None,
    k: Annotated[int | None, typer.Option(
        min=1, max=16, show_default=False,
        help="draft tokens per step (default: the policy's evaluation.k, the k its cycles "
        "replay at)")] = None,
    deployment: Annotated[str | None, typer.Option(
        callback=deployment_name, show_default=False, help="whose traffic and live version "
        "(default: the --policy file's `deployment`, else `default`)")] = None,
    policy: Annotated[str | None, typer.Option(
        help=POLICY_HELP + " whose gate decides (default: the one the deployment's controller "
        "recorded when it started, else the shipped default; `autospec promote` takes this "
        "decision as evidence)")] = None,
    record: Annotated[bool, typer.Option(
        help="write the evaluation and decision to the store")] = True,
    speed: Annotated[bool | None, typer.Option(
        show_default=False,
        help="measure the speedup by decoding prompts of the window against target-only "
        "decoding (interleaved, on the replicas' torch threads; replayed τ ÷ the step cost at "
        "the replayed drafts per step); --no-speed: the gate uses the estimate (default: the "
        "policy's evaluation.speed.enabled, on in the shipped policies)")] = None,
    speed_prompts: Annotated[int | None, typer.Option(
        min=1, max=64, show_default=False,
        help="prompts decoded to measure speed (default: the policy's "
        "evaluation.speed.prompts, 4 in the shipped default)")] = None,
    speed_repeats: Annotated[int | None, typer.Option(
        min=1, max=20, show_default=False,
        help="rounds per prompt (default: the policy's evaluation.speed.repeats, 2 in the "
        "shipped default)")] = None,
    speed_max_tokens: Annotated[int | None, typer.Option(
        min=4, max=1024, show_default=False,
        help="new tokens per timed decode (default: the policy's "
        "evaluation.speed.max_tokens, 32 in the shipped default)")] = None,
    synthetic_heldout: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help="held-out synthetic sequences (autospec synth) of the target replayed beside the "
        "real requests for the overfitting guard (0: none; default: the policy's "
        "training.synthetic.heldout_sequences, 64)")] = None,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    json_path: Annotated[Path | None, typer.Option(
        "--json-path", callback=checked_json_file, metavar="FILE",
        help="also write JSON here (its folder is checked before anything runs; a write that "
        "fails at the end is said on stderr after the table, exit 2, or 3 where the gate "
        "rejects)")] = None,
) -> None:
    """Replay held-out logged requests with each version (the window less any request a
    version evaluated trained on): τ, a paired CI of Δτ, per-segment results, estimated and
    measured speedup and the gate's decision (exit 0: promote, 3: reject)."""
    from autospec import store
    from autospec.controller.policy_record import policy_in_force
    from autospec.evaluate.run import (
        EvaluationError,
        evaluate_versions,
        select_requests,
        serving_load,
    )
    from autospec.numerics import load_served_target, served
    from autospec.threads import resolve_threads, within
    from autospec.versions import check_registered

    spec = parse_window(window)
    with _errors():  # one line, exit 2, as the operator commands (a database error: the root)
        db = store.open_store(database_url)
        given = policy_in_force(None, deployment="", given=policy) if policy else None
        deployment = deployment or (given.policy.deployment if given else DEFAULT_DEPLOYMENT)
        in_force = given or policy_in_force(db, deployment=deployment)
        k = k or in_force.policy.evaluation.k
        settings = _speed_settings(in_force.policy, enabled=speed, prompts=speed_prompts,
                                   repeats=speed_repeats, max_tokens=speed_max_tokens)
        if synthetic_heldout is None:
            synthetic_heldout = in_force.policy.training.synthetic.heldout_sequences
        # stderr, --json or not: stdout stays the document
        err.print(Text(f"gate: policy {in_force.policy.name!r} ({in_force.origin}), k = {k}"))
        versions = _compared(db, versions, deployment)
        check_registered(db, versions)
        examples = select_requests(db, deployment=deployment, **spec)
        if not examples:
            raise EvaluationError(f"no usable logged requests in the window {window!r} of "
                                  f"deployment {deployment!r} (none logged, or all opted out)")
        examples, left_out = _held_out(db, versions, examples, window)
        tgt = load_served_target(db, deployment=deployment, target=target, dtype=dtype)
        replicas = served(db, deployment=deployment)
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("shadow replay", total=len(examples))
            timed = bar.add_task("speed (interleaved decodes)", total=None,
                                 visible=settings.enabled)
            report = evaluate_versions(
                db=db, target=tgt, versions=versions, examples=examples, k=k, record=record,
                policy=in_force.policy.gate, deployment=deployment,
                progress=_shown(bar, task, "shadow replay (requests)"), speed=settings,
                speed_progress=_shown(bar, timed, "speed (interleaved decodes)"),
                synthetic_heldout=synthetic_heldout,
                threads=within(replicas.threads, resolve_threads(in_force.policy.threads)),
                serving=serving_load(db, deployment=deployment, engine=replicas.engine,
                                     concurrency=settings.concurrency),
                unmeasured="--no-speed" if speed is False else
                f"evaluation.speed.enabled is off in policy {in_force.policy.name!r}")
    _report(report, dict(left_out_trained_on=left_out, policy_in_force=in_force.as_dict()),
            json_out=json_out, json_path=json_path)


def _compared(db, versions: list[str], deployment: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The versions to replay: one named is compared with the live one (builtin-ngram where
    none is); a version named twice, or one named that is already live, is an
    :class:`EvaluationError` before the target loads."""
    from autospec import store
    from autospec.evaluate.run import EvaluationError
    from autospec.versions import BUILTIN_VERSION

    if len(set(versions)) != len(versions):
        raise EvaluationError(f"a version is named twice: {list(versions)}")
    if len(versions) > 1:
        return list(versions)
    with store.session_scope(db, readonly=True) as session:
        live = store.get_live(session, deployment=deployment)
    incumbent = live.version if live else BUILTIN_VERSION
    if versions[0] == incumbent:
        live_for = (f"is already live for {deployment}" if live else
                    f"drafts for {deployment} (no version is live)")
        raise EvaluationError(f"{incumbent} {live_for}; name a version to compare it with")
    return [versions[0], incumbent]


def _speed_settings(policy, **given: int | bool | None):  # type: ignore[no-untyped-def]
    """The policy's ``evaluation.speed`` (as the controller's cycles measure), with the
    options given on the command line in its place; threads within the policy's cap, as a
    cycle's are (:mod:`autospec.threads`)."""
    from autospec.threads import resolve_threads

    settings = policy.evaluation.speed.model_copy(
        update={name: value for name, value in given.items() if value is not None})
    return settings.within(resolve_threads(policy.threads))


def _report(report, extra: dict, *, json_out: bool, json_path: Path | None) -> None:  # type: ignore[no-untyped-def]
    """The table (or ``--json``), the ``--json-path`` file; exit 3 where the gate rejects,
    else 2 where the file could not be written (a script must not read success)."""
    data = _as_json(report) | extra
    if json_out:
        typer.echo(json.dumps(data, indent=2, default=json_default))
    else:
        _print(report)
    written = True
    if json_path:  # after the table: a failed write loses neither it nor the gate's verdict
        try:
            json_path.write_text(json.dumps(data, indent=2, default=json_default))
        except OSError as exc:
            written = False
            err.print(f"error: --json-path {json_path}: could not write it ({exc.strerror or exc})"
                      f"; the evaluation is above", highlight=False, markup=False, soft_wrap=True)
    if report.decision is not None and not report.decision.promote:
        raise typer.Exit(3)
    if not written:
        raise typer.Exit(2)


def _shown(bar: Progress, task: TaskID, what: str) -> Callable[[int, int | None], None]:
    """A stage's progress on stderr (``--json`` too: stdout is the document): its bar, and
    where stderr is no terminal (a script's capture, a log file: rich draws nothing there)
    a line each time another tenth of it is done."""
    plain, said = not err.is_terminal, [-1]

    def update(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)
        if plain and total and done * 10 // total > said[0]:
            said[0] = done * 10 // total
            err.print(Text(f"{what}: {done}/{total}"))
    return update


def _held_out(db, versions: list[str], examples: list,
              window: str) -> tuple[list, dict[str, int]]:
    """``examples`` less the requests a version evaluated (or an ancestor of it) trained on,
    said on stderr; an :class:`EvaluationError` where none is left."""
    from autospec.evaluate.unseen import held_out_only

    kept, left_out, took = held_out_only(db, versions, examples, f"the window {window!r}")
    if left_out:
        err.print(f"left out {len(examples) - len(kept)} of {len(examples)} requests of the "
                  f"window: a version evaluated trained on them", highlight=False)
        for w in took:
            err.print(Text(f"  • {w.describe()}"))
    return kept, left_out


def _as_json(report) -> dict:
    data = asdict(report.evaluation)
    data["speed_basis"] = report.evaluation.speed_basis
    # what the table's "measured speedup" column shows and the gate compares (measured.speedup
    # is the decodes' own median ratio, the table's "decoded")
    data["speedup_measured"] = report.evaluation.measured_speedup
    data["gate_speedup"] = report.evaluation.gate_speedup
    data["decision"] = asdict(report.decision) if report.decision else None
    data["evaluation_id"] = report.evaluation_id
    data["window"] = [report.window_start, report.window_end]
    return data


def _measured(ev, version: str) -> tuple[str, str, str]:
    """Step cost (at the replayed drafts per step), measured speedup (replayed τ ÷ that
    step cost), decoded median [IQR]."""
    if ev.measured is None:
        return "—", "—", "—"
    m = ev.measured
    q = m.spread.get(version) or []
    iqr = f" [{q[0]:.2f}, {q[1]:.2f}]" if len(q) == 2 else ""
    cost = m.step_cost_at(version, ev.draft_tokens_per_step.get(version))
    return (f"{cost:.2f}" if cost else "—", f"{ev.measured_speedup[version]:.2f}×",
            f"{m.speedup[version]:.2f}×{iqr}")


def _print_synthetic(ev) -> None:
    from autospec.evaluate.compare import tau_text

    syn = ev.synthetic
    if syn is None:
        out.print("no held-out synthetic sequences of this target (autospec synth): "
                  "real held-out τ only")
        return
    taus = ", ".join(f"{v} {tau_text(t)}" for v, t in syn.tau.items())
    delta = (f"; Δτ = {syn.delta.delta:+.3f}, CI [{syn.delta.low:+.3f}, "
             f"{syn.delta.high:+.3f}]" if syn.delta else "")
    out.print(Text(f"held-out synthetic τ ({syn.num_sequences} sequences, not gated): "
                   f"{taus}{delta}"))


def speed_note(m) -> str:  # type: ignore[no-untyped-def]
    """How the measured speedup was measured (below the table)."""
    where = (f"on vLLM at {m.concurrency} requests in flight" if m.engine == "vllm"
             else f"{m.threads} torch threads")
    return (f"measured speedup = τ ÷ step cost (a speculative step's time in target-only "
            f"tokens' time at the replayed drafts per step d: 1 + c·d, c a drafted token's "
            f"cost, median of {m.rounds} interleaved rounds: {m.prompts} prompts "
            f"× {m.repeats}, {m.max_tokens} tokens, {where}, target-only "
            f"{m.tokens_per_s['target-only']:.1f} tokens/s); the gate used it. decoded: the "
            f"rounds' own speedup")


def _print(report) -> None:
    from autospec.evaluate.compare import tau_text

    ev = report.evaluation
    left = f" ({ev.unreplayable} left out: settings replay cannot apply)" \
        if ev.unreplayable else ""
    table = Table(title=f"shadow evaluation: {ev.num_requests} requests{left}, k = {ev.k}")
    for col in ("version", "τ", "drafts/step", "acceptance by position", "est. speedup",
                "step cost", "measured speedup", "decoded [IQR]"):
        table.add_column(col, justify="left" if col == "version" else "right")
    for v in ev.versions:
        rates = " ".join(f"{r:.2f}" for r in ev.accepted_per_position[v])
        table.add_row(*map(Text, (v, tau_text(ev.tau[v]), f"{ev.draft_tokens_per_step[v]:.2f}",
                                  rates, f"{ev.speedup[v]:.2f}×", *_measured(ev, v))))
    out.print(table)
    if ev.measured is None:
        out.print(Text(f"speed not measured ({ev.unmeasured}): the gate used the estimated "
                       "speedup"))
    else:
        out.print(Text(speed_note(ev.measured)))
    if ev.delta is not None:
        out.print(Text(f"Δτ ({ev.candidate} − {ev.incumbent}) = {ev.delta.delta:+.3f}, "
                       f"{ev.ci_level:.0%} CI [{ev.delta.low:+.3f}, {ev.delta.high:+.3f}]"))
    _print_synthetic(ev)
    seg = Table(title="per segment")
    for col in ("segment", "requests", *[f"τ {v}" for v in ev.versions], "Δτ [CI]"):
        seg.add_column(col, justify="left" if col == "segment" else "right")
    for s in ev.segments:
        d = f"{s.delta.delta:+.3f} [{s.delta.low:+.3f}, {s.delta.high:+.3f}]" if s.delta else "—"
        seg.add_row(*map(Text, (s.segment, str(s.num_requests),
                                *[tau_text(s.tau[v]) for v in ev.versions], d)))
    out.print(seg)
    if report.decision is not None:
        colour = "green" if report.decision.promote else "red"
        out.print(Text(f"decision: {report.decision.verdict}", style=f"bold {colour}"))
        for reason in report.decision.reasons:
            out.print(Text(f"  • {reason}"))

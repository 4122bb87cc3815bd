"""Operator commands: ``status``, ``promote``, ``rollback``, ``versions``, ``history`` (and
the helpers :mod:`autospec.controller.run_cli`'s ``controller run|once|watch`` share).

Every command takes ``--json`` (one JSON document on stdout) and prints rich tables
otherwise; a ``promote`` or ``rollback`` refused prints its refusal as one too
(:func:`refused_json`), beside the line on stderr. The database is ``--database-url`` (or
``--url``), else ``AUTOSPEC_DATABASE_URL`` (or the default SQLite file).
Errors are one line on stderr, never a traceback. Exit codes, for scripts:

- ``0`` — done: promoted, rolled back, listed; ``controller once``: promoted, nothing to
  do, or another controller holds the lease;
- ``2`` — error: bad policy file or option, database unreachable or failing (locked,
  read-only, its connection lost: the database and the driver's message, one line, as for
  every command: :mod:`autospec.cli_errors`), unknown version, a
  cycle that failed (training/evaluation error, lost lease), a ``promote`` or ``rollback``
  whose pointer another promotion moved while it ran (nothing moved; run it again);
- ``3`` — refused: the gate rejected every candidate (``controller once``), ``promote``
  without a passing evaluation against the live version, nothing to roll back to.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autospec.actor import cli_actor
from autospec.cli_options import DatabaseUrl, deployment_name, segment_name
from autospec.controller.status_view import fmt, print_status
from autospec.jsonout import json_default
from autospec.names import DEFAULT_DEPLOYMENT

# what an operator or the store wrote goes out as a rich Text, printed as written: never read
# as markup or an emoji code ("fix [/] tag", ":x:"); markup styles only the commands' labels
out = Console()
err = Console(stderr=True)

EXIT_ERROR, EXIT_REFUSED = 2, 3

POLICY_HELP = ("a shipped policy by name (default, conservative; a file of that name is "
               "./default) or the path of a YAML file")
DbUrl = DatabaseUrl  # --database-url / --url, as every command that opens the store


#: known errors of modules that import torch: (module, class)
HEAVY_ERRORS = (("autospec.engine.target", "TargetLoadError"),
                ("autospec.evaluate.run", "EvaluationError"),
                ("autospec.numerics", "NumericsMismatch"),
                ("autospec.train.errors", "TrainingError"),
                ("autospec.versions", "VersionLoadError"))


def _raised_from(exc: Exception, errors: tuple[tuple[str, str], ...]) -> bool:
    """Whether ``exc`` is one of ``errors``, without importing their modules: an instance of
    a class exists only once its module has been imported (a failed ``status`` took 5 s
    importing torch to learn that its error was none of them)."""
    for module, name in errors:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


@contextmanager
def _errors(refusal: dict[str, Any] | None = None) -> Iterator[None]:
    """A refusal or a known error as one line (exit 3 or 2); anything else propagates. The
    error types are imported only when something was raised, and those of modules that
    import torch (which ``status`` and ``history`` never need) not at all
    (:func:`_raised_from`). ``refusal`` (a ``--json`` command's): a refusal is also a JSON
    object on stdout, :func:`refused_json` of it."""
    try:
        yield
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except Exception as exc:
        from autospec.controller.lease import LeaseLost
        from autospec.controller.operations import Refused
        from autospec.controller.policy import PolicyError
        from autospec.store.errors import StoreError

        if isinstance(exc, Refused):
            if refusal is not None:
                _emit(refused_json(str(exc), **refusal))
            _fail(str(exc), EXIT_REFUSED)
        if isinstance(exc, (PolicyError, StoreError)) or _raised_from(exc, HEAVY_ERRORS):
            _fail(str(exc), EXIT_ERROR)
        if isinstance(exc, LeaseLost):
            _fail(f"the controller lost its lease: {exc}", EXIT_ERROR)
        raise  # a database error (SQLAlchemyError): one line at the root, autospec.cli_errors


def refused_json(reason: str, **named: Any) -> dict[str, Any]:
    """What a ``--json`` command prints on stdout when it refuses (exit 3), as ``controller
    once`` gives an ``outcome`` and its ``exit_code``: ``{"outcome": "refused", "reason":
    ..., "exit_code": 3}`` and what the command was asked (``named``: deployment, version,
    segment; those given)."""
    return {"outcome": "refused", "reason": reason, "exit_code": EXIT_REFUSED,
            **{key: value for key, value in named.items() if value is not None}}


def _fail(message: str, code: int) -> None:
    label = "refused" if code == EXIT_REFUSED else "error"
    err.print(Text.assemble((f"{label}:", "bold red"), " ", message), soft_wrap=True)
    raise typer.Exit(code)


LOG_LEVEL_HELP = "logging level of its progress, on stderr (WARNING: only problems)"


def _log_to_stderr(level: str) -> None:
    """The controller's progress (the cycle's stages, the watch's checks) as log lines on
    stderr, so ``--json`` on stdout stays one document."""
    if level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise typer.BadParameter(f"unknown logging level {level!r}: DEBUG, INFO, WARNING, "
                                 "ERROR or CRITICAL", param_hint="--log-level")
    level = level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("autospec").setLevel(level)
    for noisy in ("alembic", "vllm"):  # alembic: "Context impl SQLiteImpl." at every store
        # opened; vLLM: its engine's start, step by step; both in full at DEBUG
        logging.getLogger(noisy).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)


def _emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=json_default))


def _db(deployment: str | None = None, url: str | None = None,  # type: ignore[no-untyped-def]
        segment: str | None = None, version: str | None = None, *, named: bool = True):
    """The store at ``url`` (``--database-url``; default: the settings'); a ``deployment``
    or a ``segment`` of it this store has never heard of is named on stderr, and the command
    goes on (a typo would otherwise show an empty status or history, or stage a pointer
    nobody follows; a new segment's pointer may be staged before its traffic comes).
    ``version``: the one a ``promote`` moves to, whose evaluations may name the segment.
    ``named=False``: no note of the deployment (``promote`` refuses an unknown one itself)."""
    from autospec import store
    from autospec.controller.names import unknown_deployment, unknown_segment

    db = store.open_store(url)
    notes = [unknown_deployment(db, deployment) if deployment is not None and named else None,
             unknown_segment(db, deployment, segment, version=version)
             if deployment is not None and segment is not None else None]
    for note in filter(None, notes):
        err.print(Text.assemble(("note:", "yellow"), " ", note), soft_wrap=True)
    return db


# -- status ---------------------------------------------------------------------------------
def status(
    deployment: Annotated[str | None, typer.Option(
        callback=deployment_name, show_default=False, help="the deployment to report on "
        "(default: the --policy file's `deployment`, else `default`)")] = None,
    policy: Annotated[str | None, typer.Option(
        help=POLICY_HELP + " (for the fresh-traffic minimum and the canary; default: the "
        "one the deployment's controller recorded when it started, else the shipped "
        "default)")] = None,
    cycles: Annotated[int, typer.Option(min=1, help="how many recent cycles to show")] = 5,
    period: Annotated[str, typer.Option(help="the ledger's period (decode time saved vs the "
                                        "loop's time): a duration such as 24h, 7d")] = "24h",
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
) -> None:
    """Live pointer, the versions replicas actually serve (their reports) and their target /
    dtype, τ (shadow; live over the last hour and day), speedup over target-only (estimated
    and measured), traffic, fresh requests since the last cycle, recent cycles, next
    scheduled run, lease, failures, and the ledger over --period (docs/ledger.md)."""
    from autospec.controller.policy_record import policy_in_force
    from autospec.controller.status import collect_status
    from autospec.durations import parse_duration

    span = parse_duration(period, "--period")  # before the store is opened
    with _errors():
        given = policy_in_force(None, deployment="", given=policy) if policy else None
        deployment = deployment or (given.policy.deployment if given else DEFAULT_DEPLOYMENT)
        db = _db(deployment, database_url)
        in_force = given or policy_in_force(db, deployment=deployment)
        data = collect_status(db, deployment=deployment, policy=in_force.policy, cycles=cycles,
                              period=span)
        data["policy_in_force"] = in_force.as_dict()
    if json_out:
        _emit(data)
    else:
        print_status(data, out)


# -- promote / rollback ---------------------------------------------------------------------
MOVE_JSON_HELP = ('print JSON: the move; refused (exit 3), {"outcome": "refused", '
                  '"reason": ..., "exit_code": 3, ...}')
SEGMENT_HELP = ("move this traffic segment's own pointer instead of the deployment's (its "
                "requests are then drafted by it: on native replicas any kind, on vLLM "
                "replicas a suffix version while the deployment's is one; docs/segments.md)")


def promote(
    version: Annotated[str, typer.Argument(help="the version to make live")],
    force: Annotated[bool, typer.Option(
        help="promote without a passing evaluation (audited as an override; needs "
        "--reason)")] = False,
    reason: Annotated[str, typer.Option(help="why (required with --force)")] = "",
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="the deployment whose pointer moves")] = "default",
    segment: Annotated[str | None, typer.Option(callback=segment_name, help=SEGMENT_HELP)] = None,
    new_deployment: Annotated[bool, typer.Option(
        "--new-deployment", help="--deployment names a new deployment: start its pointer at "
        "VERSION (without it, a deployment no replica, request, pointer, evaluation or event "
        "of the store names is refused: a typo would start a pointer no replica "
        "follows)")] = False,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help=MOVE_JSON_HELP)] = False,
) -> None:
    """Make VERSION live — only with a passing evaluation against the live version, unless
    --force --reason "..." (exit 0 promoted, 3 refused, 2 error). With --segment, for that
    segment: passing there means an evaluation of VERSION against the version drafting the
    segment now whose per-segment results show the segment with Δτ ≥ 0 on at least
    gate.min_segment_requests of its requests, as set by the policy that evaluation ran
    under (the controller's, or `autospec evaluate --policy`; each evaluation records it)."""
    from autospec.controller.operations import promote_version

    if force and not reason.strip():
        _fail("--force needs --reason \"...\" (it is recorded in the audit log)", EXIT_ERROR)
    asked = {"deployment": deployment, "segment": segment, "version": version}
    with _errors(asked if json_out else None):
        data = promote_version(_db(deployment, database_url, segment, version, named=False),
                               version=version, actor=cli_actor(), force=force, reason=reason,
                               deployment=deployment, segment=segment,
                               new_deployment=new_deployment)
    if json_out:
        _emit(data)
    else:
        out.print(_moved((f"{data['kind']}{_on(segment)}:", "green"),
                         f"{data['from']} → {data['version']} ({data['reason']})"))


def _on(segment: str | None) -> str:
    return f" (segment {segment})" if segment else ""


def _moved(label: tuple[str, str], text: str) -> Text:
    """A pointer's move: its ``(label, style)``, then ``text`` as written."""
    return Text.assemble(label, " ", text)


def rollback(
    reason: Annotated[str, typer.Option(help="why (recorded)")] = "operator rollback",
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="the deployment whose pointer moves")] = "default",
    segment: Annotated[str | None, typer.Option(callback=segment_name, help=SEGMENT_HELP)] = None,
    unpin: Annotated[bool, typer.Option(
        "--unpin", help="with --segment: drop the segment's own pointer instead, so the "
        "deployment's version drafts it again (an `unpin` event)")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="roll back even where the canary has just rolled the pointer back "
        "(that would put the version the canary rolled back live again, with no canary)")] = False,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help=MOVE_JSON_HELP)] = False,
) -> None:
    """Point the deployment (or --segment's pointer) back at its previous version, in one
    step (exit 0, 3 nothing to roll back or refused, 2 error). A second rollback undoes the
    first; where the first was the canary's, it is refused without --force. `--segment S
    --unpin`: S follows the deployment's version again."""
    from autospec.controller.operations import rollback_version, unpin_segment

    if unpin and segment is None:
        raise typer.BadParameter("--unpin needs --segment (the deployment's pointer cannot be "
                                 "unpinned)", param_hint="--unpin")
    with _errors({"deployment": deployment, "segment": segment} if json_out else None):
        db = _db(deployment, database_url, segment)
        data = (unpin_segment(db, actor=cli_actor(), reason=reason, deployment=deployment,
                              segment=segment) if unpin and segment is not None else
                rollback_version(db, actor=cli_actor(), reason=reason, deployment=deployment,
                                 segment=segment, force=force))
    if json_out:
        _emit(data)
    elif unpin:
        out.print(_moved((f"unpinned{_on(segment)}:", "yellow"),
                         f"{data['from']} → the deployment's {data['version']}"))
    else:
        out.print(_moved((f"rolled back{_on(segment)}:", "yellow"),
                         f"{data['from']} → {data['version']}"))


# -- versions / history ---------------------------------------------------------------------
versions_app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


@versions_app.callback()
def versions(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(
        help="only this state (candidate, live, retired, rejected, rolled_back)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1_000_000, help="newest N")] = 50,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Registered speculator versions, newest first: state, the pointers each is live for
    (deployment, deployment/segment; the built-in version drafts for every deployment while
    nothing is promoted) and its last evaluation (`autospec versions prune`: delete old
    versions' artifacts)."""
    if ctx.invoked_subcommand is not None:
        return

    from autospec.controller.operations import list_versions
    from autospec.store.models import SPECULATOR_STATES

    if state is not None and state not in SPECULATOR_STATES:
        raise typer.BadParameter(f"{state!r} is not a state; states: "
                                 f"{', '.join(SPECULATOR_STATES)}", param_hint="--state")
    with _errors():
        rows = list_versions(_db(None, database_url), state=state, limit=limit)
    if json_out:
        _emit(rows)
        return
    table = Table(title="speculator versions")
    table.add_column("version", no_wrap=True)  # a name, never cut
    for col in ("kind", "state", "parent", "created", "last evaluation"):
        table.add_column(col, overflow="fold" if col == "parent" else "ellipsis")
    for r in rows:
        ev = r["evaluation"]
        kind = r["kind"] + (" (base)" if r["base"] else "")
        table.add_row(*map(Text, (
            r["version"], kind, _state(r), str(r["parent"] or "—"), str(r["created_at"])[5:16],
            "—" if not ev else f"#{ev['id']} {ev['decision']} vs {ev['incumbent']}: τ "
            f"{fmt(ev['tau_candidate'])} vs {fmt(ev['tau_incumbent'])}")))
    out.print(table)


def _state(row: dict) -> str:
    """The version's state, and the pointers it is live for."""
    if row["default_live"]:
        return "live for every deployment (nothing promoted yet)"
    return row["state"] + (f" for {', '.join(row['live_for'])}" if row["live_for"] else "")


@versions_app.command("prune")
def versions_prune(
    keep: Annotated[int, typer.Option(min=0, help="keep the newest N versions' artifacts (live, "
                                      "previous, served, pending and base versions are "
                                      "always kept)")] = 5,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only list what would go")] = False,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Delete the artifacts of old versions nobody can need (rows kept, marked pruned, audited)."""
    from autospec.settings import get_settings
    from autospec.store.prune import prune

    with _errors():
        done = prune(_db(None, database_url), artifact_dir=get_settings().resolved_artifact_dir,
                     keep=keep, dry_run=dry_run, actor=cli_actor()).as_dict()
    if json_out:
        _emit(done)
        return
    verb = "would prune" if dry_run else "pruned"
    for entry in done["pruned"]:
        out.print(Text(f"{verb} {entry['version']}: {entry['artifact']} "
                       f"({entry['bytes'] / 1e6:.1f} MB)"))
    for entry in done["skipped"]:
        out.print(Text(f"skipped {entry['version']}: {entry['why']}"))
    for version, why in done["kept"].items():
        out.print(Text(f"kept {version}: {'; '.join(why)}"))
    out.print(f"{verb} {len(done['pruned'])} versions' artifacts "
              f"({done['bytes'] / 1e6:.1f} MB), kept {len(done['kept'])}", highlight=False)


def history(
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="the deployment")] = "default",
    limit: Annotated[int, typer.Option(min=1, max=1_000_000, help="newest N events")] = 30,
    segment: Annotated[str | None, typer.Option(callback=segment_name,
        help="only this traffic segment's events (its pointer's moves, its load "
        "failures)")] = None,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The audit log: promotions, rollbacks, overrides, rejections, failures, cycles,
    canary and drift notes, the replicas' swaps, imports, policies and purges (a segment's
    events name it: `promotion [S]`)."""
    from autospec.controller.operations import list_history

    with _errors():
        rows = list_history(_db(deployment, database_url, segment), deployment=deployment,
                            limit=limit, segment=segment)
    if json_out:
        _emit(rows)
        return
    table = Table(title="history")
    for col in ("time", "event", "actor", "version", "from", "reason"):  # names fold, not cut
        table.add_column(col, overflow="fold" if col in ("version", "from") else "ellipsis")
    for r in rows:
        event = r["event"] + (f" [{r['segment']}]" if r.get("segment") else "")
        table.add_row(*map(Text, (str(r["time"])[:19], event, r["actor"],
                                  str(r["version"] or "—"), str(r["from_version"] or "—"),
                                  r["reason"])))
    out.print(table)

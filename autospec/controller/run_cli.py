"""``autospec controller run|once|watch``: the retraining controller from the command line
(exit codes, ``--json`` and errors as :mod:`autospec.controller.cli` describes)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.text import Text

from autospec.cli_options import deployment_name
from autospec.controller.cli import (
    LOG_LEVEL_HELP,
    POLICY_HELP,
    DbUrl,
    _db,
    _emit,
    _errors,
    _log_to_stderr,
    err,
    out,
)
from autospec.controller.result import CycleResult, moves

controller_app = typer.Typer(help="Run the retraining controller (scheduled or one cycle).",
                             no_args_is_help=True)


def _controller(policy: str, target: str | None, dtype: str | None,  # type: ignore[no-untyped-def]
                address: str | None = None, threads: int | None = None,
                database_url: str | None = None, deployment: str | None = None):
    from autospec import numerics
    from autospec.controller.cycle import Controller
    from autospec.controller.policy import parse_policy, policy_text
    from autospec.controller.policy_record import record_policy

    text, source = policy_text(policy)
    pol = parse_policy(text, source=source)
    if deployment is not None and deployment != pol.deployment:
        pol = pol.model_copy(update={"deployment": deployment})
        source = f"{source}, deployment {deployment!r} by --deployment"
    db = _db(pol.deployment, database_url)  # a deployment the store never heard of: a note
    # refuse options the deployment does not serve now, before any cycle; the target is
    # loaded (and checked again against the deployment's record) when a cycle needs it
    spec, _ = numerics.resolve(db, deployment=pol.deployment, target=target, dtype=dtype)
    numerics.targets.check_spec(spec)  # a target that names none: refused now, not each cycle
    numerics.engine_for(db, deployment=pol.deployment, wanted=pol.training.engine)
    if address and pol.training.workers:  # join the cluster now, before a cycle starts
        from autospec.train.ray_trainer import connect_ray

        connect_ray(address=address, workers=pol.training.workers)
    elif address:
        err.print(Text(f"note: policy {policy!r} trains in this process (training.workers: "
                       "0); --address is not used"))

    controller = Controller(db, pol, lambda: numerics.load_served_target(
        db, deployment=pol.deployment, target=target, dtype=dtype), threads=threads)
    logging.getLogger(__name__).info(
        "a cycle's torch work runs on %d thread%s (%s)", controller.threads,
        "" if controller.threads == 1 else "s",
        f"--threads {threads}" if threads else f"policy threads: {pol.threads}")
    record_policy(db, policy=pol, text=text, source=source, actor=controller.holder)
    return controller


TARGET_OPT = typer.Option(help="the served target: a name, directory or .gguf (default: "
                          "what the deployment's replicas serve, else smollm2-135m)")
DTYPE_OPT = typer.Option(help="target dtype for training and replay (default: the "
                         "deployment's, as its replicas recorded it; another one is refused)")
THREADS_OPT = typer.Option(
    min=1, help="torch CPU threads of a cycle's work in this process (and, shared out, of its "
    "Ray Train workers); default: the policy's `threads` (auto in the shipped policies: the "
    "CPUs less one, so a replica on the same machine keeps one; autospec/threads.py)")
DEPLOYMENT_OPT = typer.Option(
    callback=deployment_name,
    help="the deployment whose traffic and live pointer the controller manages (default: "
    "the policy's `deployment`, `default` in the shipped policies)")
ADDRESS_OPT = typer.Option(
    "--address", help="Ray cluster for the policy's Ray Train runs (training.workers > 0): "
    "host:port, 'auto' or ray://host:10001; default RAY_ADDRESS, else a new local Ray")


@controller_app.command("once")
def once(
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = "default",
    target: Annotated[str | None, TARGET_OPT] = None,
    dtype: Annotated[str | None, DTYPE_OPT] = None,
    address: Annotated[str | None, ADDRESS_OPT] = None,
    threads: Annotated[int | None, THREADS_OPT] = None,
    deployment: Annotated[str | None, DEPLOYMENT_OPT] = None,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    log_level: Annotated[str, typer.Option(help=LOG_LEVEL_HELP)] = "INFO",
) -> None:
    """Run one cycle now (cron-friendly). Exit 0: promoted, nothing to do or busy;
    3: every candidate rejected; 2: error; 143 / 130: stopped by SIGTERM / Ctrl-C, the lease
    given back (the next cycle records this one interrupted)."""
    _log_to_stderr(log_level)
    with _errors(), _stopped():
        controller = _controller(policy, target, dtype, address, threads, database_url, deployment)
        result = controller.run_cycle(trigger="once")
    if json_out:
        _emit(result.as_dict())
    else:
        _print_cycle(result)
    raise typer.Exit(result.exit_code)


@contextmanager
def _stopped() -> Iterator[None]:
    """SIGTERM or Ctrl-C stops the command in one line, exit 143 or 130, its lease given
    back on the way out (it was left held until its TTL: the next controller answered busy
    for that long); a cycle stopped so is recorded interrupted by the next one."""
    from autospec.stopping import interrupt_on_sigterm, interrupted_code

    interrupt_on_sigterm()
    try:
        yield
    except KeyboardInterrupt as exc:
        err.print(Text(f"stopped ({exc.args[0] if exc.args else 'SIGINT'}): the lease is "
                       "given back; a cycle left unfinished is recorded interrupted by the "
                       "next one"))
        raise typer.Exit(interrupted_code(exc)) from None


def _print_cycle(result: CycleResult, lead: str = "", indent: str = "") -> None:
    """A cycle's outcome and what moved (the deployment's pointer, each segment's) after
    ``lead``, then its reasons, one a line."""
    colour = {"promoted": "green", "rejected": "yellow", "failed": "red"}.get(
        result.outcome, "blue")
    moved = moves(result.promoted, result.segments)
    out.print(Text.assemble(lead, (result.outcome, f"bold {colour}"),
                            f" {', '.join(moved)}" if moved else ""))
    for reason in result.reasons:
        out.print(Text(f"{indent}  • {reason}"))


@controller_app.command("watch")
def watch(
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = "default",
    target: Annotated[str | None, TARGET_OPT] = None,
    dtype: Annotated[str | None, DTYPE_OPT] = None,
    address: Annotated[str | None, ADDRESS_OPT] = None,
    threads: Annotated[int | None, THREADS_OPT] = None,
    deployment: Annotated[str | None, DEPLOYMENT_OPT] = None,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    log_level: Annotated[str, typer.Option(help=LOG_LEVEL_HELP)] = "INFO",
) -> None:
    """One canary/drift check now (rolls back on a canary shortfall; drift runs a cycle)."""
    from autospec.controller.watch import Watcher

    _log_to_stderr(log_level)
    with _errors(), _stopped():
        controller = _controller(policy, target, dtype, address, threads, database_url, deployment)
        result = Watcher(controller).run()
    if json_out:
        _emit(result.as_dict())
    else:
        out.print(Text.assemble((result.action, "bold"),
                                f" {result.version}" if result.version else ""))
        for reason in result.reasons:
            out.print(Text(f"  • {reason}"))
        if result.cycle is not None:  # the drift's early cycle: what it moved, and why
            _print_cycle(result.cycle, lead=f"  cycle {result.cycle.cycle_id or '-'}: ",
                         indent="  ")
    code = result.cycle.exit_code if result.cycle else 0
    raise typer.Exit(code)


@controller_app.command("run")
def run(
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = "default",
    target: Annotated[str | None, TARGET_OPT] = None,
    dtype: Annotated[str | None, DTYPE_OPT] = None,
    address: Annotated[str | None, ADDRESS_OPT] = None,
    threads: Annotated[int | None, THREADS_OPT] = None,
    deployment: Annotated[str | None, DEPLOYMENT_OPT] = None,
    database_url: DbUrl = None,
    log_level: Annotated[str, typer.Option(help=LOG_LEVEL_HELP)] = "INFO",
) -> None:
    """Run the scheduler in the foreground: cycles on the policy's schedule, the canary /
    drift watch in between. Ctrl-C or SIGTERM stops it at once, with the processes it
    started (vLLM engines of a speed measurement); a running cycle is recorded as
    interrupted by the next controller."""
    from autospec.controller.scheduler import run_forever
    from autospec.stopping import exit_on_sigterm, stop_now

    _log_to_stderr(log_level)
    exit_on_sigterm()
    try:
        with _errors():
            run_forever(_controller(policy, target, dtype, address, threads, database_url,
                                    deployment))
    except KeyboardInterrupt:
        err.print("stopped")
        stop_now(130)


"""``autospec train``: train one candidate on a window of traffic and register it.

With ``--workers N`` the run uses Ray Train: on the cluster at ``--address`` (or
``RAY_ADDRESS``), else on a local Ray started for the run.

Options of the new speculator's config come as ``--set key=value`` (repeatable), validated
by the kind's config model (:mod:`autospec.train.overrides`); the command builds a
:class:`~autospec.train.run.TrainRequest`, runs it and prints the outcome.

Prints the registered version (``--json``: one JSON object with version, run id,
artifact, SHA-256 and metrics). The target and its dtype are the deployment's
(what its replicas recorded; :mod:`autospec.numerics`) unless given. Bad input — an empty
window, a window below ``--min-requests`` (both said before the target loads), an incumbent
built for another target, a target or dtype the deployment does not serve, an unknown kind,
a bad option, a database URL autospec cannot use, a database it cannot reach or a SQLite
file that does not exist (never created here) — is one line on stderr, no traceback, exit
status 2, as is a database that fails during the run (locked, read-only, its connection
lost: :mod:`autospec.cli_errors`); a run that fails otherwise is recorded as failed (nothing
registered) and exits with status 1.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from autospec.cli_options import DatabaseUrl, deployment_name
from autospec.jsonout import json_default
from autospec.speculators.registry import kinds_help, trainable_kinds

if TYPE_CHECKING:
    from autospec.train.run import TrainOutcome, TrainRequest

out = Console()
err = Console(stderr=True)


@contextmanager
def _errors() -> Iterator[None]:
    import pydantic

    from autospec.engine.target import TargetLoadError
    from autospec.numerics import NumericsMismatch
    from autospec.speculators.registry import UnknownSpeculatorKind
    from autospec.store.errors import (
        BadDatabaseURL,
        DatabaseUnreachable,
        SchemaError,
        StoreError,
    )
    from autospec.train.errors import TrainingError, TrainingInputError

    try:
        yield
    except (TrainingInputError, UnknownSpeculatorKind, TargetLoadError, NumericsMismatch,
            pydantic.ValidationError, BadDatabaseURL, DatabaseUnreachable, SchemaError) as exc:
        _fail(exc, 2)
    except (TrainingError, StoreError, OSError) as exc:  # OSError: a file the run writes
        _fail(exc, 1)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted:[/] the run is recorded as failed; nothing registered")
        raise typer.Exit(130) from None


def _fail(exc: BaseException, code: int) -> None:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__name__ == "ValidationError":
        text = " ".join(str(exc).split("\n")[:3])
    err.print(Text.assemble(("error:", "bold red"), " ", text), soft_wrap=True)
    raise typer.Exit(code) from None


class _RichProgress:
    """Draws the run's phases as rich progress bars (training: loss and accuracy); on a
    console that is not a terminal (a log file), where rich draws nothing until the end, a
    line per phase and per finished epoch instead."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None
        self.plain = not progress.console.is_terminal
        self.started = time.perf_counter()
        self.last: Any = None  # the newest step's metrics (plain: printed per epoch)

    def _line(self, text: str) -> None:
        self.progress.console.print(Text(f"{time.perf_counter() - self.started:6.0f}s {text}"))

    def phase(self, name: str, total: int | None) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[-1].total or 0)
        self.task = self.progress.add_task(name, total=total, info="")
        if self.plain:
            self._epoch_done()
            self._line(name + (f" ({total})" if total else ""))

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)

    def step(self, metrics) -> None:  # type: ignore[no-untyped-def]
        if self.plain and self.last is not None and metrics.epoch != self.last.epoch:
            self._epoch_done()
        self.last = metrics
        self.progress.update(self.task, advance=1, info=_metrics_text(metrics))

    def finish(self) -> None:
        """The run is over: the last epoch's line (plain)."""
        if self.plain:
            self._epoch_done()

    def _epoch_done(self) -> None:
        if self.last is not None:
            self._line(f"  epoch {self.last.epoch + 1} done: {_metrics_text(self.last)}")
            self.last = None


def _metrics_text(metrics) -> str:  # type: ignore[no-untyped-def]
    acc = "/".join(f"{a:.2f}" for a in metrics.accuracy)
    return f"loss {metrics.loss:.3f} acc {acc} epoch {metrics.epoch + 1}"


KIND_HELP = "the kind to train: " + kinds_help(trainable_kinds())
SET_HELP = ("a field of the new speculator's config, KEY=VALUE (repeat), validated by the "
            "kind's config model: eagle3 draft_vocab_size, ttt_steps, tree_nodes, tree_width, "
            "tree_min_prob, suffix_threshold (null: the head alone), ...; draft num_layers, "
            "...; suffix max_match, ... (a bad key lists the kind's fields)")


def train(
    kind: Annotated[str, typer.Option(help=KIND_HELP)],
    window: Annotated[str, typer.Option(help="traffic: newest N requests (500), a duration "
                                        "(24h, 7d) or both (7d:500)")] = "7d",
    assignments: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    workers: Annotated[int, typer.Option(min=0, help="0: train in this process; N: Ray "
                                         "Train, N workers (DDP)")] = 0,
    epochs: Annotated[int, typer.Option(min=1, help="passes over the training part")] = 3,
    from_scratch: Annotated[bool, typer.Option(
        "--from-scratch", help="do not warm-start from the incumbent")] = False,
    incumbent: Annotated[str | None, typer.Option(
        help="version to warm-start from (default: the live one, if of this kind)")] = None,
    deployment: Annotated[str, typer.Option(callback=deployment_name,
        help="deployment whose traffic is trained on and held out (anchors too) and whose "
        "live version is the incumbent")] = "default",
    segment: Annotated[str | None, typer.Option(help="only traffic of this segment")] = None,
    min_requests: Annotated[int, typer.Option(
        min=1, help="fewest training (not held-out) requests to train on (the controller "
        "takes its policy's training.min_train_requests; this command reads no policy)")] = 20,
    heldout_fraction: Annotated[float, typer.Option(
        min=0.0, max=0.9, help="newest share held out, never trained on (the controller "
        "takes its policy's window.heldout_fraction: 0.2 in the shipped default, 0.25 in "
        "conservative; this command reads no policy)")] = 0.1,
    anchors: Annotated[int, typer.Option(
        min=0, help="requests from before the window mixed in")] = 0,
    synthetic_share: Annotated[float, typer.Option(
        min=0.0, max=0.9, help="share of the training part made of synthetic sequences "
        "(autospec synth) of this target; 0: none")] = 0.0,
    loss: Annotated[str, typer.Option(
        help="eagle3: kl (target distribution) or ce (greedy)")] = "kl",
    feature_noise: Annotated[float, typer.Option(
        min=0.0, help="eagle3: Gaussian noise on the target features while training "
        "(x each layer's RMS)")] = 0.2,
    lr: Annotated[float | None, typer.Option(
        help="peak learning rate (default per kind)")] = None,
    batch_size: Annotated[int, typer.Option(
        min=1, help="sequences per step (per worker)")] = 8,
    seed: Annotated[int, typer.Option(help="seed (the run is deterministic under it)")] = 0,
    precision: Annotated[str, typer.Option(
        help="fp32, bf16 (autocast, fp32 weights) or auto (bf16 on CUDA and on CPUs with "
        "native bfloat16)")] = "auto",
    time_budget: Annotated[float | None, typer.Option(
        min=1.0, help="seconds for features + training; training ends early, keeping what "
        "it learnt, when they are used up")] = None,
    max_failures: Annotated[int, typer.Option(
        min=0, help="Ray: worker failures to survive")] = 1,
    use_gpu: Annotated[bool, typer.Option("--use-gpu", help="Ray: GPU workers")] = False,
    address: Annotated[str | None, typer.Option(
        help="Ray: join this cluster (host:port, 'auto' or ray://host:10001; default "
        "RAY_ADDRESS, else a new local Ray)")] = None,
    target: Annotated[str | None, typer.Option(
        help="target: a name, a directory or a .gguf (default: what the deployment's "
        "replicas serve, else smollm2-135m)")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="target dtype: float32, bfloat16 or auto (default: the deployment's; another "
        "one is refused)")] = None,
    database_url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Train a candidate speculator on fresh traffic and register it."""
    logging.getLogger("autospec").setLevel(logging.WARNING)
    with _errors():
        request = _request(kind=kind, window=window, assignments=assignments or [],
                           segment=segment, heldout_fraction=heldout_fraction,
                           anchors=anchors, address=address, epochs=epochs, workers=workers,
                           synthetic_share=synthetic_share,
                           from_scratch=from_scratch, incumbent=incumbent,
                           deployment=deployment, min_requests=min_requests, seed=seed,
                           batch_size=batch_size, lr=lr, loss=loss, use_gpu=use_gpu,
                           max_failures=max_failures, precision=precision,
                           time_budget_s=time_budget, feature_noise=feature_noise)
        outcome = _run(request, database_url=database_url, address=address, target=target,
                       dtype=dtype, quiet=as_json)
    _print(outcome, as_json=as_json)


def _request(*, kind: str, window: str, assignments: list[str], segment: str | None,
             heldout_fraction: float, anchors: int, address: str | None,
             synthetic_share: float = 0.0, **fields: Any) -> TrainRequest:
    """The TrainRequest of the command line; TrainingInputError naming a bad option."""
    from autospec.train.data import SyntheticMix, parse_window
    from autospec.train.errors import TrainingInputError
    from autospec.train.overrides import parse_overrides
    from autospec.train.run import TrainRequest

    if kind not in trainable_kinds():
        raise TrainingInputError(f"unknown kind {kind!r}; trainable kinds: "
                                 f"{', '.join(trainable_kinds())}")
    if address and not fields["workers"]:
        raise TrainingInputError("--address needs --workers N (it is where Ray Train runs)")
    _check_choices(loss=fields["loss"], precision=fields["precision"])
    if fields["loss"] != "kl" and kind != "eagle3":
        raise TrainingInputError(f"--loss {fields['loss']} applies to eagle3 only; {kind} "
                                 "always trains on the target's distribution (kl)")
    spec = parse_window(window)
    spec = type(spec)(since=spec.since, limit=spec.limit, segment=segment,
                      deployment=fields["deployment"], heldout_fraction=heldout_fraction,
                      anchor_requests=anchors)
    mix = SyntheticMix(share=synthetic_share) if synthetic_share else None
    return TrainRequest(kind=kind, window=spec, overrides=parse_overrides(kind, assignments),
                        synthetic=mix, **fields)


def _check_choices(*, loss: str, precision: str) -> None:
    """--loss and --precision, which a run reads only after its features (minutes in)."""
    from autospec.speculators.training import LOSSES
    from autospec.train.errors import TrainingInputError
    from autospec.train.loop import check_precision

    if loss not in LOSSES:
        raise TrainingInputError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    check_precision(precision, "--precision")


def _run(request: TrainRequest, *, database_url: str | None, address: str | None,
         target: str | None, dtype: str | None, quiet: bool) -> TrainOutcome:
    from autospec import store
    from autospec.numerics import load_served_target
    from autospec.train.data import load_training_data
    from autospec.train.run import train_candidate

    engine = store.open_store(database_url)  # a store with traffic: never a new one
    _check_incumbent(engine, request.incumbent)
    with store.session_scope(engine, readonly=True) as session:  # empty or short: say it now
        data = load_training_data(session, request.window, min_requests=request.min_requests)
    if address or (request.workers and os.environ.get("RAY_ADDRESS")):  # join it now, before
        # any work is done: a cluster that cannot be joined fails in seconds, not after features
        from autospec.train.ray_trainer import connect_ray

        connect_ray(address=address, workers=request.workers)
    model = load_served_target(engine, deployment=request.deployment, target=target,
                               dtype=dtype)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err, transient=quiet) as bars:
        shown = _RichProgress(bars)
        outcome = train_candidate(request, engine=engine, target=model, progress=shown,
                                  data=data)
        shown.finish()
        return outcome


def _check_incumbent(engine: Any, incumbent: str | None) -> None:
    """An ``--incumbent`` the store does not hold is bad input (exit 2), refused before the
    target loads."""
    from autospec.train.errors import TrainingInputError
    from autospec.versions import VersionLoadError, check_registered

    if incumbent is None:
        return
    try:
        check_registered(engine, [incumbent])
    except VersionLoadError as exc:
        raise TrainingInputError(f"--incumbent: {exc}") from None


def _print(outcome: TrainOutcome, *, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps({"version": outcome.version, "run_id": outcome.run_id,
                                   "parent": outcome.parent, "artifact": str(outcome.artifact),
                                   "sha256": outcome.sha256, "metrics": outcome.metrics},
                                  default=json_default))
        return
    m = outcome.metrics
    after = m.get("heldout_after") or {}
    detail = (f"held-out top-1 {after['accuracy'][0]:.3f}" if after else
              f"held-out replay τ(k=5) {m['heldout_replay_tau_k5']:.2f}"
              if "heldout_replay_tau_k5" in m else "")
    out.print(Text.assemble("registered ", (outcome.version, "bold"), " (candidate, parent "
                            f"{outcome.parent or 'none'}) from run {outcome.run_id}: "
                            f"{m.get('examples_seen', 0)} examples seen; {detail}"))
    out.print(Text(f"artifact {outcome.artifact} sha256 {outcome.sha256[:16]}…"))
    held = (m.get("window") or {}).get("heldout_requests")
    if held is not None:
        from autospec.evaluate.gate import GatePolicy

        out.print(Text(f"`autospec evaluate {outcome.version}` replays its {held} held-out "
                       f"requests and those logged after them, never the ones it trained on "
                       f"(the gate needs {GatePolicy().min_heldout} by default)"))

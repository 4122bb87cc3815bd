"""``autospec train``: train one candidate on a window of traffic and register it.

With ``--workers N`` the run uses Ray Train: on the cluster at ``--address`` (or
``RAY_ADDRESS``), else on a local Ray started for the run.

Prints the registered version (``--json``: one JSON object with version, run id,
artifact, SHA-256 and metrics). The target and its dtype are the deployment's
(what its replicas recorded; :mod:`autospec.numerics`) unless given. Bad input — an empty
window, a window below the policy minimum, an incumbent built for another target, a
target or dtype the deployment does not serve, an unknown kind or a bad option — is one
line on stderr, no traceback, exit status 2; a run that fails is recorded as failed
(nothing registered) and exits with status 1.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

out = Console()
err = Console(stderr=True)


_EAGLE3_ONLY = {"draft_vocab_size", "ttt_steps", "suffix_threshold", "tree_nodes", "tree_width",
                "tree_min_prob"}

@contextmanager
def _errors() -> Iterator[None]:
    import pydantic

    from autospec.engine.target import TargetLoadError
    from autospec.numerics import NumericsMismatch
    from autospec.speculators.registry import UnknownSpeculatorKind
    from autospec.store.errors import StoreError
    from autospec.train.errors import TrainingError, TrainingInputError

    try:
        yield
    except (TrainingInputError, UnknownSpeculatorKind, TargetLoadError, NumericsMismatch,
            pydantic.ValidationError) as exc:
        _fail(exc, 2)
    except (TrainingError, StoreError) as exc:
        _fail(exc, 1)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted:[/] the run is recorded as failed; nothing registered")
        raise typer.Exit(130) from None


def _fail(exc: BaseException, code: int) -> None:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__name__ == "ValidationError":
        text = " ".join(str(exc).split("\n")[:3])
    err.print(f"[bold red]error:[/] {text}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


class _RichProgress:
    """Draws the run's phases as rich progress bars (training: loss and accuracy)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None

    def phase(self, name: str, total: int | None) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[-1].total or 0)
        self.task = self.progress.add_task(name, total=total, info="")

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)

    def step(self, metrics) -> None:
        acc = "/".join(f"{a:.2f}" for a in metrics.accuracy)
        self.progress.update(self.task, advance=1,
                             info=f"loss {metrics.loss:.3f} acc {acc} epoch {metrics.epoch + 1}")


def train(
    kind: str = typer.Option(..., help="eagle3, draft or suffix"),
    window: str = typer.Option("7d", help="traffic: newest N requests (500), a duration "
                               "(24h, 7d) or both (7d:500)"),
    workers: int = typer.Option(0, min=0, help="0: train in this process; N: Ray Train, "
                                "N workers (DDP)"),
    epochs: int = typer.Option(3, min=1, help="passes over the training part"),
    from_scratch: bool = typer.Option(False, "--from-scratch",
                                      help="do not warm-start from the incumbent"),
    incumbent: str | None = typer.Option(None, help="version to warm-start from "
                                         "(default: the live one, if of this kind)"),
    deployment: str = typer.Option("default", help="deployment whose live version is "
                                   "the incumbent"),
    segment: str | None = typer.Option(None, help="only traffic of this segment"),
    min_requests: int = typer.Option(20, min=1, help="policy minimum of training requests"),
    heldout_fraction: float = typer.Option(0.1, min=0.0, max=0.9,
                                           help="newest share held out, never trained on"),
    anchors: int = typer.Option(0, min=0, help="requests from before the window mixed in"),
    draft_vocab_size: int | None = typer.Option(None, help="eagle3: reduced vocabulary size"),
    ttt_steps: int | None = typer.Option(None, help="eagle3: training-time-test depth"),
    suffix_threshold: float | None = typer.Option(
        None, min=0.0, max=1.0, help="eagle3: propose the suffix index's continuation (built "
        "from the window, stored with the head) where its expected accepted length reaches "
        "this fraction of k (default 0.7)"),
    head_only: bool = typer.Option(False, "--head-only",
                                   help="eagle3: no suffix index, the head drafts every step"),
    tree_nodes: int | None = typer.Option(
        None, min=0, max=64, help="eagle3: greedy requests get a tree of this many drafts "
        "(the head's likeliest continuations), verified in one target forward; 0: a chain "
        "of k (default 16)"),
    tree_width: int | None = typer.Option(None, min=1, max=8, help="eagle3: candidates "
                                          "expanded per tree depth (default 4)"),
    tree_min_prob: float | None = typer.Option(
        None, min=0.0, max=1.0, help="eagle3: leave tree candidates below this cumulative "
        "probability out (default 0.05, for CPUs; 0 on GPUs)"),
    num_layers: int | None = typer.Option(None, help="draft: decoder layers"),
    loss: str = typer.Option("kl", help="eagle3: kl (target distribution) or ce (greedy)"),
    feature_noise: float = typer.Option(0.2, min=0.0, help="eagle3: Gaussian noise on the "
                                        "target features while training (x each layer's RMS)"),
    lr: float | None = typer.Option(None, help="peak learning rate (default per kind)"),
    batch_size: int = typer.Option(8, min=1, help="sequences per step (per worker)"),
    seed: int = typer.Option(0, help="seed (the run is deterministic under it)"),
    precision: str = typer.Option("auto", help="fp32, bf16 (autocast, fp32 weights) or auto "
                                  "(bf16 on CUDA and on CPUs with native bfloat16)"),
    time_budget: float | None = typer.Option(
        None, min=1.0, help="seconds for features + training; training ends early, keeping "
        "what it learnt, when they are used up"),
    max_failures: int = typer.Option(1, min=0, help="Ray: worker failures to survive"),
    use_gpu: bool = typer.Option(False, "--use-gpu", help="Ray: GPU workers"),
    address: str | None = typer.Option(None, help="Ray: join this cluster (host:port, "
                                       "'auto' or ray://host:10001; default RAY_ADDRESS, "
                                       "else a new local Ray)"),
    target: str | None = typer.Option(
        None, help="target: a name, a directory or a .gguf (default: what the deployment's "
        "replicas serve, else smollm2-135m)"),
    dtype: str | None = typer.Option(
        None, help="target dtype: float32, bfloat16 or auto (default: the deployment's; "
        "another one is refused)"),
    database_url: str | None = typer.Option(None, "--url",
                                            help="database (default AUTOSPEC_DATABASE_URL)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Train a candidate speculator on fresh traffic and register it."""
    logging.getLogger("autospec").setLevel(logging.WARNING)
    with _errors():
        from autospec import store
        from autospec.numerics import load_served_target
        from autospec.train import TRAINABLE_KINDS, TrainingInputError, TrainRequest
        from autospec.train.data import parse_window
        from autospec.train.run import train_candidate

        if kind not in TRAINABLE_KINDS:
            raise TrainingInputError(f"unknown kind {kind!r}; trainable kinds: "
                                     f"{', '.join(TRAINABLE_KINDS)}")
        if address and not workers:
            raise TrainingInputError("--address needs --workers N (it is where Ray Train runs)")
        spec = parse_window(window)
        spec = type(spec)(since=spec.since, limit=spec.limit, segment=segment,
                          heldout_fraction=heldout_fraction, anchor_requests=anchors)
        overrides = {k: v for k, v in (("draft_vocab_size", draft_vocab_size),
                                       ("ttt_steps", ttt_steps), ("num_layers", num_layers),
                                       ("suffix_threshold", suffix_threshold),
                                       ("tree_nodes", tree_nodes), ("tree_width", tree_width),
                                       ("tree_min_prob", tree_min_prob))
                     if v is not None}
        misplaced = [name for name in overrides if name in _EAGLE3_ONLY and kind != "eagle3"]
        if misplaced or (head_only and kind != "eagle3"):
            flags = [f"--{n.replace('_', '-')}" for n in misplaced] or ["--head-only"]
            raise TrainingInputError(f"{', '.join(flags)}: eagle3 options, not for {kind}")
        if head_only:
            if suffix_threshold is not None:
                raise TrainingInputError("--head-only and --suffix-threshold exclude each other")
            overrides["suffix_threshold"] = None
        request = TrainRequest(kind=kind, window=spec, epochs=epochs, workers=workers,
                               from_scratch=from_scratch, incumbent=incumbent,
                               deployment=deployment, min_requests=min_requests, seed=seed,
                               batch_size=batch_size, lr=lr, loss=loss, overrides=overrides,
                               use_gpu=use_gpu, max_failures=max_failures,
                               precision=precision, time_budget_s=time_budget,
                               feature_noise=feature_noise)
        engine = store.open_store(database_url, upgrade=True)
        if address:  # join the cluster now, before any work is done
            from autospec.train.ray_trainer import connect_ray

            connect_ray(address=address, workers=workers)
        model = load_served_target(engine, deployment=deployment, target=target, dtype=dtype)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
        with Progress(*columns, console=err, transient=as_json) as bars:
            outcome = train_candidate(request, engine=engine, target=model,
                                      progress=_RichProgress(bars))
    if as_json:
        out.print_json(json.dumps({"version": outcome.version, "run_id": outcome.run_id,
                                   "parent": outcome.parent, "artifact": str(outcome.artifact),
                                   "sha256": outcome.sha256, "metrics": outcome.metrics},
                                  default=str))
        return
    m = outcome.metrics
    after = m.get("heldout_after") or {}
    detail = (f"held-out top-1 {after['accuracy'][0]:.3f}" if after else
              f"held-out replay τ(k=5) {m['heldout_replay_tau_k5']:.2f}"
              if "heldout_replay_tau_k5" in m else "")
    out.print(f"registered [bold]{outcome.version}[/] (candidate, parent "
              f"{outcome.parent or 'none'}) from run {outcome.run_id}: "
              f"{m.get('examples_seen', 0)} examples seen; {detail}")
    out.print(f"artifact {outcome.artifact} sha256 {outcome.sha256[:16]}…")

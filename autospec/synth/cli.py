"""``autospec synth`` and ``autospec pretrain``: synthetic data, and a base head from it.

``synth``: have the target answer prompts and store the answers as synthetic data.

Builds a :class:`~autospec.synth.run.SynthRequest` from the options, loads the target the
deployment serves (its dtype too: synthetic rows are only used for the same target,
revision and dtype), runs it printing one line per finished batch, and prints what was
written (``--json``: one JSON object). Bad input — an unknown source, a negative
temperature or 0 with resampled prompts, ``--engine vllm`` without vLLM, a ``--vllm-option``
vLLM would not take (or synthesis sets, or the native engine would ignore), no logged prompt to
resample, a target without a tokenizer for domain prompts, a target or
dtype the deployment does not serve — is one line on stderr, exit status 2.

``pretrain``: :func:`autospec.synth.pretrain.pretrain_base` (generate per domain, train a
base eagle3 head on the target's synthetic sequences, register it marked ``base``), one
line per training phase; bad input (a database URL autospec cannot use or cannot reach, a
schema to upgrade too) exits 2, a failed run 1. In both, a database that fails under the
command (locked, read-only, its connection lost) is one line and exit 2
(:mod:`autospec.cli_errors`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from autospec.cli_options import DatabaseUrl, check_engine_options, deployment_name, engine_options
from autospec.jsonout import json_default

if TYPE_CHECKING:
    from autospec.synth.run import SourceResult, SynthOutcome

out = Console()
err = Console(stderr=True)

# options both commands take, declared once
DtypeOption = Annotated[str | None, typer.Option(
    help="target dtype (default: the deployment's; another one is refused)")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object")]
EngineOption = Annotated[str, typer.Option(
    help="who answers: native (the target's model in batches), vllm (vLLM's offline engine, "
    "continuous batching; starting it took ~110 s on a 2-core CPU) or auto (vllm on a CUDA GPU "
    "with vLLM installed, else native — as autospec serve decides)")]
VllmOption = Annotated[list[str] | None, typer.Option(
    help="--engine vllm: a vLLM engine argument as KEY=VALUE (VALUE as JSON, else a string), "
    "as autospec serve takes it, e.g. enforce_eager=true (the engine starts in seconds, not "
    "minutes, on a CPU) or max_num_seqs=64; repeatable")]
#: the engine arguments synthesis sets itself (what sets them), refused as --vllm-option;
#: the rest are the user's (a speculative_config too: synthesis does not draft otherwise)
SYNTH_MANAGED = {"model": "the target directory, from --target", "dtype": "from --dtype",
                 "max_model_len": "the longest prompt + --max-tokens",
                 "seed": "--seed, per prompt"}
TemperatureOption = Annotated[float, typer.Option(
    min=0.0, help="sampling temperature (0: greedy, domain sources only — resampled "
    "prompts need > 0)")]

SOURCE_HELP = ("where prompts come from (repeat): resampled (logged prompts, answered "
               "again), domain:support, domain:coding, domain:json")


def synth(
    sources: Annotated[list[str] | None, typer.Option(
        "--source", help=SOURCE_HELP)] = None,
    count: Annotated[int, typer.Option(min=1, help="sequences per source")] = 64,
    temperature: TemperatureOption = 0.8,
    top_p: Annotated[float, typer.Option(min=0.01, max=1.0, help="nucleus sampling")] = 0.95,
    max_tokens: Annotated[int, typer.Option(min=1, help="new tokens per answer at most")] = 128,
    batch_size: Annotated[int, typer.Option(min=1, help="prompts decoded together")] = 8,
    heldout_fraction: Annotated[float, typer.Option(
        min=0.0, max=0.9, help="share of prompts kept for the overfitting guard, never "
        "trained on (by a hash of the prompt: stable across runs)")] = 0.1,
    window: Annotated[int, typer.Option(
        min=1, help="resampled: prompts of the newest N usable logged requests")] = 1000,
    seed: Annotated[int, typer.Option(
        help="sampling seed and domain prompt draw (domain prompts come from the half of each "
        "domain's prompt space the load generator never sends)")] = 0,
    engine: EngineOption = "auto",
    vllm_option: VllmOption = None,
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="whose traffic and target")] = "default",
    target: Annotated[str | None, typer.Option(
        help="target: a name, a directory or a .gguf (default: what the deployment's "
        "replicas serve, else smollm2-135m)")] = None,
    dtype: DtypeOption = None,
    database_url: DatabaseUrl = None,
    as_json: JsonOption = False,
) -> None:
    """Generate synthetic training sequences with the target (never logged as traffic)."""
    from autospec.synth.run import SynthRequest

    logging.getLogger("autospec").setLevel(logging.WARNING)
    request = SynthRequest(sources=tuple(sources or ["resampled"]), count=count,
                           temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                           batch_size=batch_size, seed=seed, heldout_fraction=heldout_fraction,
                           window=window, deployment=deployment, engine=engine,
                           vllm_options=_vllm_options(vllm_option))
    outcome = _run(request, database_url=database_url, target=target, dtype=dtype,
                   quiet=as_json)
    _print(outcome, as_json=as_json)


def _vllm_options(pairs: list[str] | None) -> dict[str, Any]:
    options = engine_options(pairs or [])
    check_engine_options(options, SYNTH_MANAGED)
    return options


def _run(request, *, database_url: str | None, target: str | None,  # type: ignore[no-untyped-def]
         dtype: str | None, quiet: bool) -> SynthOutcome:
    from autospec import store
    from autospec.engine.target import TargetLoadError
    from autospec.numerics import NumericsMismatch, load_served_target
    from autospec.synth.backends import SynthEngineUnavailable
    from autospec.synth.run import SynthError, check_request, synthesize

    try:
        check_request(request)
        engine = store.open_store(database_url, upgrade="create")
        model = load_served_target(engine, deployment=request.deployment, target=target,
                                   dtype=dtype)
        return synthesize(request, engine=engine, target=model,
                          progress=None if quiet else _progress)
    except (SynthError, SynthEngineUnavailable, TargetLoadError, NumericsMismatch,
            store.StoreError) as exc:
        _fail(exc, 2)


def _progress(result: SourceResult, done: int, total: int) -> None:
    err.print(Text(f"{result.source}: {done}/{total} prompts answered ({result.train} train, "
                   f"{result.heldout} held out, {result.output_tokens} tokens, "
                   f"{result.seconds:.1f} s)"))


def _print(outcome: SynthOutcome, *, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps({"run_id": outcome.run_id, "target": asdict(outcome.target),
                                   "engine": outcome.engine, "written": outcome.written,
                                   "sources": [asdict(s) for s in outcome.sources]}))
        return
    t = outcome.target
    out.print(Text(f"run {outcome.run_id}: {outcome.written} synthetic sequences of "
                   f"{t.target_id} (revision {t.revision}, {t.dtype}; answered by "
                   f"{outcome.engine})"))
    for s in outcome.sources:
        rate = s.output_tokens / s.seconds if s.seconds else 0.0
        out.print(Text(f"  {s.source}: {s.train} train, {s.heldout} held out, "
                       f"{s.output_tokens} tokens ({rate:.0f} tokens/s)"))


class _LineProgress:
    """Training phases as lines on stderr (a line per phase; a loss line every 20 steps)."""

    def phase(self, name: str, total: int | None) -> None:
        err.print(Text(f"{name} ({total if total is not None else '?'})"))

    def advance(self, n: int = 1) -> None:
        pass

    def step(self, metrics) -> None:  # type: ignore[no-untyped-def]
        if metrics.step % 20 == 0:
            err.print(f"  step {metrics.step}: loss {metrics.loss:.3f}", highlight=False)


def pretrain(
    domains: Annotated[list[str] | None, typer.Option(
        "--domain", help="workload domain to generate from (repeat; default: all)")] = None,
    per_domain: Annotated[int, typer.Option(
        min=0, help="new sequences generated per domain first (0: train on the stored "
        "synthetic sequences only)")] = 400,
    max_sequences: Annotated[int, typer.Option(
        min=1, help="newest synthetic sequences of the target trained on")] = 4000,
    temperature: Annotated[float, typer.Option(
        min=0.0, help="sampling temperature of the answers (0: greedy)")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="new tokens per answer at most")] = 128,
    gen_batch_size: Annotated[int, typer.Option(
        min=1, help="prompts decoded together while generating")] = 32,
    engine: EngineOption = "auto",
    vllm_option: VllmOption = None,
    epochs: Annotated[int, typer.Option(min=1, help="passes over the sequences")] = 8,
    batch_size: Annotated[int, typer.Option(min=1, help="sequences per training step")] = 8,
    assignments: Annotated[list[str] | None, typer.Option(
        "--set", help="a field of the eagle3 config, KEY=VALUE (repeat)")] = None,
    seed: Annotated[int, typer.Option(help="generation and training seed")] = 0,
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="whose target")] = "default",
    target: Annotated[str | None, typer.Option(
        help="target (default: what the deployment's replicas serve, else smollm2-135m)")] = None,
    dtype: DtypeOption = None,
    database_url: DatabaseUrl = None,
    as_json: JsonOption = False,
) -> None:
    """Train a base eagle3 head for the target from synthetic data (every workload domain)
    and register it; later eagle3 training starts from it when no eagle3 head is live.

    The defaults are the measured recipe (docs/training.md): 400 greedy answers per domain,
    8 epochs; for SmolLM2-135M in bfloat16 on 2 CPU cores with --engine vllm, ~3 minutes
    generating and ~14 training."""
    from autospec.synth.pretrain import PretrainRequest
    from autospec.synth.run import SynthRequest

    logging.getLogger("autospec").setLevel(logging.WARNING)
    request = PretrainRequest(
        domains=tuple(domains or PretrainRequest().domains), per_domain=per_domain,
        max_sequences=max_sequences, epochs=epochs, batch_size=batch_size, seed=seed,
        deployment=deployment, synth=SynthRequest(temperature=temperature, seed=seed,
                                                  max_new_tokens=max_tokens,
                                                  batch_size=gen_batch_size,
                                                  engine=engine,
                                                  vllm_options=_vllm_options(vllm_option)))
    outcome = _pretrain(request, assignments or [], database_url=database_url, target=target,
                        dtype=dtype)
    if as_json:
        out.print_json(json.dumps({"version": outcome.version, "run_id": outcome.run_id,
                                   "artifact": str(outcome.artifact), "sha256": outcome.sha256,
                                   "metrics": outcome.metrics}, default=json_default))
        return
    after = outcome.metrics.get("heldout_after") or {}
    top1 = f"; held-out synthetic top-1 {after['accuracy'][0]:.3f}" if after else ""
    out.print(Text.assemble("registered base ", (outcome.version, "bold"),
                            f" from run {outcome.run_id}: "
                            f"{outcome.metrics['window']['synthetic_sequences']} synthetic "
                            f"sequences{top1}"))


def _pretrain(request, assignments: list[str], *, database_url: str | None,  # type: ignore[no-untyped-def]
              target: str | None, dtype: str | None):
    import pydantic

    from autospec import store
    from autospec.engine.target import TargetLoadError
    from autospec.numerics import NumericsMismatch, load_served_target
    from autospec.synth.backends import SynthEngineUnavailable
    from autospec.synth.pretrain import generation, pretrain_base
    from autospec.synth.run import SynthError
    from autospec.train.errors import TrainingError, TrainingInputError
    from autospec.train.overrides import parse_overrides

    try:
        request = type(request)(**{**request.__dict__,
                                   "overrides": parse_overrides("eagle3", assignments)})
        generation(request)  # an unknown --domain or --engine: before the target loads
        engine = store.open_store(database_url, upgrade="create")
        model = load_served_target(engine, deployment=request.deployment, target=target,
                                   dtype=dtype)
        return pretrain_base(request, engine=engine, target=model, progress=_LineProgress(),
                             synth_progress=_progress)
    except (SynthError, SynthEngineUnavailable, TargetLoadError, NumericsMismatch,
            TrainingInputError, pydantic.ValidationError, store.DatabaseUnreachable,
            store.BadDatabaseURL, store.SchemaError) as exc:
        _fail(exc, 2)
    except (TrainingError, store.StoreError) as exc:
        _fail(exc, 1)


def _fail(exc: BaseException, code: int) -> None:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    err.print(Text.assemble(("error:", "bold red"), " ", text), soft_wrap=True)
    raise typer.Exit(code) from None

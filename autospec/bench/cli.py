"""``autospec bench ...``: benchmarks that measure side by side and report ratios."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autospec.bench.checks import (
    checked_checkpoint,
    checked_directory,
    checked_out_directory,
    checked_out_file,
    checked_store,
    checked_target,
)
from autospec.bench.serve_options import (
    bench_prompts,
    checked_bands,
    checked_suffix_cache,
    checked_suffix_warm,
    checked_vllm_suffix,
    client_counts,
)
from autospec.bench.swap_cli import swap as swap_command
from autospec.cli_options import deployment_name
from autospec.json_file import json_file_option
from autospec.speculators.registry import KINDS

bench_app = typer.Typer(help="Benchmarks (side by side in one process; ratios, not timings).",
                        no_args_is_help=True)


@bench_app.command("decode")
def decode(
    target: Annotated[str, typer.Option(
        help="target: a name, a model directory or .gguf")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, auto, or a comma list")] = "auto",
    max_new_tokens: Annotated[int, typer.Option(
        "--max-tokens", "--max-new-tokens", min=1, help="tokens generated per prompt")] = 64,
    k: Annotated[int, typer.Option(min=1, help="draft tokens per step")] = 5,
    prompts: Annotated[int, typer.Option(min=1, max=6, help="how many of the fixed prompts")] = 4,
    kinds: Annotated[str, typer.Option(
        help=f"speculator kinds to run, of: {', '.join(KINDS)}")] = "ngram,draft,eagle3",
    eagle3: Annotated[Path | None, typer.Option(help="an eagle3 checkpoint directory")] = None,
    draft: Annotated[Path | None, typer.Option(help="a draft checkpoint directory")] = None,
    json_path: Annotated[Path | None, json_file_option()] = None,
) -> None:
    """Compare HF generate, HF prompt lookup, the engine alone and with each speculator."""
    from autospec.bench.decode import run_decode_bench
    from autospec.speculators.checkpoint import SpeculatorLoadError

    checkpoints = {name: path for name, path in (("eagle3", eagle3), ("draft", draft)) if path}
    dtypes, names = _checked_decode_inputs(dtype, kinds)
    checked_target(target)
    for name, path in checkpoints.items():
        checked_checkpoint(path, f"--{name}")
    try:
        run_decode_bench(target_spec=target, dtypes=dtypes, max_new=max_new_tokens, k=k,
                         num_prompts=prompts, kinds=names, checkpoints=checkpoints,
                         json_path=json_path)
    except SpeculatorLoadError as exc:  # a checkpoint built for another target
        typer.echo(f"bench decode: {exc}", err=True)
        raise typer.Exit(2) from None


def _checked_decode_inputs(dtype: str, kinds: str) -> tuple[list[str], list[str]]:
    """``--dtype`` and ``--kinds`` as lists, each name checked before anything loads (a
    misspelt kind used to end in a traceback after the baselines had run)."""
    from autospec.engine.target import TargetLoadError, check_dtype
    from autospec.speculators.registry import UnknownSpeculatorKind, kind

    dtypes = [d.strip() for d in dtype.split(",") if d.strip()]
    names = [s.strip() for s in kinds.split(",") if s.strip()]
    try:
        for d in dtypes or [""]:
            check_dtype(d)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from None
    try:
        for name in names:
            kind(name)
    except UnknownSpeculatorKind as exc:
        raise typer.BadParameter(str(exc), param_hint="--kinds") from None
    return dtypes, names


bench_app.command("swap")(swap_command)


@bench_app.command("store")
def store(
    database_url: Annotated[str | None, typer.Option(
        "--database-url", "--url", help="database to measure (default: a temporary SQLite "
        "file, and PostgreSQL too at AUTOSPEC_BENCH_POSTGRES_URL, else "
        "AUTOSPEC_TEST_POSTGRES_URL, when set)")] = None,
    rows: Annotated[int, typer.Option(min=100, help="request rows to ingest")] = 20000,
    json_path: Annotated[Path | None, json_file_option()] = None,
) -> None:
    """Rows/s ingested by the traffic writer and the caller-side cost of record()."""
    from autospec.bench.store import main
    from autospec.store import db
    from autospec.store.errors import BadDatabaseURL

    if database_url is not None:  # a malformed URL was a traceback; a MySQL one measured
        try:  # a temporary SQLite file only
            db.make_engine(database_url).dispose()
        except BadDatabaseURL as exc:
            raise typer.BadParameter(str(exc), param_hint="--database-url") from None
    main(database_url=database_url, rows=rows, json_path=json_path)


@bench_app.command("serve")
def serve(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(
        help="target: a name, a model directory or .gguf")] = "smollm2-135m",
    max_tokens: Annotated[int, typer.Option(
        min=1, help="tokens per request in the decode phase")] = 32,
    rounds: Annotated[int, typer.Option(
        min=1, help="interleaved rounds over the configurations")] = 3,
    concurrency: Annotated[str | None, typer.Option(
        help="concurrent clients in the decode phase (default 2); with --engine, a list: one "
        "phase per value, e.g. 1,4,8 (the default), to see where speculation stops paying")] = None,
    short_requests: Annotated[int, typer.Option(
        min=5, help="1-token requests per round and config in the logging phase")] = 40,
    k: Annotated[int, typer.Option(min=1, help="draft tokens per step")] = 5,
    json_path: Annotated[Path | None, json_file_option()] = None,
    engine: Annotated[str | None, typer.Option(
        help="compare serving engines instead, e.g. 'vllm,native': tokens/s per request and "
        "throughput at each --concurrency, speculation on and off")] = None,
    k_bands: Annotated[str | None, typer.Option(
        help="--engine: also serve the version with these concurrency bands, e.g. "
        "'1-2:5,3-:0' (k per band, 0: no drafting), and say whether it is ever slower than "
        "target-only")] = None,
    builtin: Annotated[bool, typer.Option(
        help="--engine: also serve builtin-ngram (on vLLM its own ngram method, what a vLLM "
        "user switches on) beside the live version, and give live over builtin")] = False,
    vllm_suffix: Annotated[bool, typer.Option(
        help="--engine vllm: also serve vLLM's own suffix method (needs the arctic-inference "
        "package, see docs/vllm.md) and give the live version over it")] = False,
    vllm_suffix_cache: Annotated[int | None, typer.Option(
        min=0, help="with --vllm-suffix: the most served responses vLLM's suffix method keeps "
        "and drafts from (its suffix_decoding_max_cached_requests; vLLM's default 10000 also "
        "learns from the bench's own earlier answers to the same prompts); 0: each request's "
        "own prompt and output only, what it gives on traffic it has not seen")] = None,
    fresh_prompts: Annotated[bool, typer.Option(
        help="--engine with --domain: every round of every load sends prompts no round sent "
        "before (the same ones to each application in that round), so a method that remembers "
        "the answers it served (vLLM's suffix) gains nothing from the bench repeating itself")
    ] = False,
    vllm_suffix_warm: Annotated[int | None, typer.Option(
        min=1, help="with --vllm-suffix and --database-url: before measuring, vLLM's suffix "
        "method answers the store's newest N logged requests, so its cache holds the traffic "
        "the live version was built from (a like-for-like comparison)")] = None,
    vllm_option: Annotated[list[str] | None, typer.Option(
        help="--engine vllm: a vLLM engine argument as KEY=VALUE, as `autospec serve` takes "
        "it (e.g. enforce_eager=true: engines start in seconds, not minutes, on a CPU); "
        "repeatable")] = None,
    dtype: Annotated[str, typer.Option(help="--engine: target dtype")] = "auto",
    database_url: Annotated[str | None, typer.Option(
        "--database-url", "--url",
        help="--engine: serve this store's live version (a promoted head) in every "
        "application (default: a fresh store, builtin-ngram)")] = None,
    deployment: Annotated[str, typer.Option(callback=deployment_name,
        help="--engine: the live pointer to serve")] = "default",
    domain: Annotated[str | None, typer.Option(
        help="--engine: chat prompts of this workload domain (support, coding, json; drawn "
        "with a seed of their own) instead of the generic benchmark prompts — the traffic a "
        "promoted head was trained on")] = None,
) -> None:
    """Requests/s and p50/p99 over HTTP: logging on vs off, speculation on vs off; with
    --engine, the engines side by side."""
    from autospec.bench.serve import run_serve_bench
    from autospec.cli_options import check_engine_options, engine_options
    from autospec.serve.cli import _given

    checked_target(target, dtype)
    if engine is not None:
        from autospec.bench.serve_engines import fresh_pool_size, run_engine_bench
        from autospec.engine.choice import ENGINES

        names = [e.strip() for e in engine.split(",") if e.strip()]
        unknown = sorted(set(names) - set(ENGINES))
        if not names or unknown:
            raise typer.BadParameter(f"--engine: unknown {unknown or names}; known: "
                                     f"{', '.join(ENGINES)}")
        counts = client_counts(concurrency or "1,4,8")
        if fresh_prompts and domain is None:
            raise typer.BadParameter("--fresh-prompts: needs --domain (the prompts to draw)")
        pool = fresh_pool_size(rounds, counts) if fresh_prompts else None
        options = engine_options(vllm_option or [])
        check_engine_options(options)
        checked_store(database_url)
        run_engine_bench(engines=names, target=target, dtype=dtype, max_tokens=max_tokens,
                         rounds=rounds, clients=counts, k=k, fresh_prompts=fresh_prompts,
                         database_url=database_url, deployment=deployment, json_path=json_path,
                         k_bands=checked_bands(k_bands, k, options if "vllm" in names
                                                else {}),
                         prompts=bench_prompts(domain, pool),
                         vllm_options=options, builtin=builtin,
                         vllm_suffix=checked_vllm_suffix(vllm_suffix, names),
                         vllm_suffix_cached=checked_suffix_cache(vllm_suffix_cache, vllm_suffix),
                         vllm_suffix_warm=checked_suffix_warm(vllm_suffix_warm, vllm_suffix,
                                                               database_url))
        return
    given = [name for name, value in (
        ("--k-bands", k_bands is not None), ("--vllm-option", vllm_option),
        ("--builtin", builtin), ("--fresh-prompts", fresh_prompts),
        ("--dtype", _given(ctx, "dtype")), ("--database-url", database_url is not None),
        ("--deployment", _given(ctx, "deployment")), ("--domain", domain is not None)) if value]
    if given:  # the logging / speculation bench takes none of them: refused, never ignored
        raise typer.BadParameter(f"{', '.join(given)}: need --engine")
    checked_vllm_suffix(vllm_suffix, [])
    checked_suffix_cache(vllm_suffix_cache, vllm_suffix)
    checked_suffix_warm(vllm_suffix_warm, vllm_suffix, database_url)
    counts = client_counts(concurrency or "2")
    if len(counts) != 1:
        raise typer.BadParameter("--concurrency: one value without --engine")
    run_serve_bench(target=target, max_tokens=max_tokens, rounds=rounds,
                    concurrency=counts[0], short_requests=short_requests, k=k,
                    json_path=json_path)


AUTO_DTYPE_HELP = "target dtype: float32, bfloat16 or auto (bfloat16 where the CPU has it)"


@bench_app.command("train")
def train(
    target: Annotated[str, typer.Option(
        help="target: a name or a model directory")] = "smollm2-135m",
    domain: Annotated[str, typer.Option(
        help="workload domain: support, coding or json")] = "support",
    requests: Annotated[int, typer.Option(min=20, help="logged requests (cached traffic)")] = 300,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-tokens", "--max-new-tokens", min=8,
        help="output tokens per logged request")] = 128,
    kinds: Annotated[str, typer.Option(help="kinds to train and measure")] = "eagle3,suffix,draft",
    k: Annotated[int, typer.Option(min=1, help="draft tokens per step")] = 5,
    epochs: Annotated[int, typer.Option(min=1, help="training epochs (eagle3, draft)")] = 16,
    eval_requests: Annotated[int, typer.Option(
        min=1, help="held-out requests decoded per method")] = 24,
    draft_vocab_size: Annotated[int, typer.Option(min=2, help="eagle3 reduced vocabulary")] = 4096,
    ttt_steps: Annotated[int, typer.Option(min=1, help="eagle3 training-time-test depth")] = 3,
    dtype: Annotated[str, typer.Option(help=AUTO_DTYPE_HELP)] = "auto",
    draft_epochs: Annotated[int, typer.Option(min=1, help="epochs for draft")] = 2,
    feature_noise: Annotated[float, typer.Option(
        min=0.0, help="eagle3 training feature noise")] = 0.2,
    heldout_fraction: Annotated[float, typer.Option(
        help="newest share of the logged requests held out: never trained on, decoded to "
        "measure")] = 0.1,
    seed: Annotated[int, typer.Option(
        help="seed of the prompts (traffic, --other-domain) and of training")] = 0,
    workdir: Annotated[Path | None, typer.Option(
        help="where the scratch store and artifacts go")] = None,
    reuse: Annotated[bool, typer.Option(
        "--reuse", help="measure candidates already trained in --workdir instead of training them "
        "again")] = False,
    variants: Annotated[str, typer.Option(
        help="eagle3 heads side by side: scratch (today's), synthetic (resampled answers "
        "mixed in), base (the base head alone, autospec pretrain), base+finetune")] = "scratch",
    synthetic_share: Annotated[float, typer.Option(
        help="synthetic: share of the train part that is synthetic")] = 0.3,
    synthetic_count: Annotated[int, typer.Option(
        min=1, help="sequences the target generates: resampled (synthetic), per domain "
        "(base)")] = 64,
    base: Annotated[Path | None, typer.Option(
        help="an eagle3 artifact directory to use as the base head instead of pretraining "
        "one")] = None,
    other_domain: Annotated[str | None, typer.Option(
        help="also decode --eval-requests prompts of this domain (none of its traffic is "
        "logged or trained on) with ngram and the variants")] = None,
    json_path: Annotated[Path | None, json_file_option()] = None,
) -> None:
    """Log domain traffic, train each kind on it, measure τ and speed on held-out requests."""
    from pydantic import ValidationError

    from autospec.bench.train import run_train_bench
    from autospec.bench.train_request import TrainBenchRequest
    from autospec.option_errors import first_error

    try:  # one field per option, same names (tests/bench/test_train_request.py)
        request = TrainBenchRequest(
            target=target, domain=domain, requests=requests, max_new_tokens=max_new_tokens,
            kinds=kinds, k=k, epochs=epochs, eval_requests=eval_requests,
            draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, dtype=dtype,
            draft_epochs=draft_epochs, feature_noise=feature_noise,
            heldout_fraction=heldout_fraction, seed=seed, workdir=workdir, reuse=reuse,
            variants=variants, synthetic_share=synthetic_share,
            synthetic_count=synthetic_count, base=base, other_domain=other_domain,
            json_path=json_path)
    except ValidationError as exc:
        raise typer.BadParameter(first_error(exc)) from None
    checked_target(target, dtype)
    checked_directory(base, "--base")
    checked_out_directory(workdir, "--workdir")
    run_train_bench(request)



@bench_app.command("segments")
def segments(
    target: Annotated[str, typer.Option(
        help="target: a name or a model directory")] = "smollm2-135m",
    domains: Annotated[str, typer.Option(
        help="workload domains mixed, one segment each (two or three of support, coding, "
        "json)")] = "json,support,coding",
    requests: Annotated[int, typer.Option(
        min=20, help="logged requests per domain (cached traffic)")] = 120,
    max_new_tokens: Annotated[int, typer.Option(
        "--max-tokens", "--max-new-tokens", min=8,
        help="output tokens per logged request and per measured decode")] = 64,
    kinds: Annotated[str, typer.Option(
        help="kinds trained globally and per segment")] = "suffix,eagle3",
    k: Annotated[int, typer.Option(min=1, help="draft tokens per step")] = 5,
    epochs: Annotated[int, typer.Option(min=1, help="training epochs (gradient kinds)")] = 8,
    select_requests: Annotated[int, typer.Option(
        min=1, help="held-out requests per domain decoded to pick the versions (the gate's "
        "measurement)")] = 4,
    eval_requests: Annotated[int, typer.Option(
        min=1, help="other held-out requests per domain decoded by both arms")] = 8,
    draft_vocab_size: Annotated[int, typer.Option(min=2, help="eagle3 reduced vocabulary")] = 4096,
    ttt_steps: Annotated[int, typer.Option(min=1, help="eagle3 training-time-test depth")] = 3,
    dtype: Annotated[str, typer.Option(help=AUTO_DTYPE_HELP)] = "auto",
    feature_noise: Annotated[float, typer.Option(
        min=0.0, help="eagle3 training feature noise")] = 0.2,
    heldout_fraction: Annotated[float, typer.Option(
        help="newest share of each domain's logged requests held out: never trained on, "
        "decoded to pick and to measure")] = 0.2,
    seed: Annotated[int, typer.Option(help="seed of the prompts and of training")] = 0,
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch threads the decodes run on (default: this process's)")] = None,
    workdir: Annotated[Path | None, typer.Option(
        help="where the scratch store and artifacts go")] = None,
    json_path: Annotated[Path | None, json_file_option()] = None,
    output: Annotated[Path | None, typer.Option(
        help="write the tables here as markdown")] = None,
) -> None:
    """Domains mixed: one global version against a version per segment, the same held-out
    requests decoded by both; τ and speedup per segment and over the mix."""
    from pydantic import ValidationError

    from autospec.bench.segments import run_segments_bench
    from autospec.bench.segments_request import HeldoutTooSmall, SegmentsBenchRequest
    from autospec.option_errors import first_error

    try:  # one field per option, same names (tests/bench/test_segments_tiny.py)
        request = SegmentsBenchRequest(
            target=target, domains=domains, requests=requests, max_new_tokens=max_new_tokens,
            kinds=kinds, k=k, epochs=epochs, select_requests=select_requests,
            eval_requests=eval_requests, draft_vocab_size=draft_vocab_size,
            ttt_steps=ttt_steps, dtype=dtype, feature_noise=feature_noise,
            heldout_fraction=heldout_fraction, seed=seed, threads=threads, workdir=workdir,
            json_path=json_path, output=output)
    except ValidationError as exc:
        raise typer.BadParameter(first_error(exc)) from None
    checked_target(target, dtype)
    checked_out_directory(workdir, "--workdir")
    checked_out_file(output, "--output")
    try:
        run_segments_bench(request)
    except HeldoutTooSmall as exc:
        typer.echo(f"bench segments: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("soak-report")
def soak_report(
    out: Annotated[Path, typer.Argument(help="a finished soak's --out directory")],
) -> None:
    """Judge a finished soak's memory, its answers from a version not live and its verdict
    again with this version's rules, from the files it left (soak.json, memory.jsonl,
    requests.jsonl, data/autospec.db); rewrites soak.md, soak.json and soak.png. Exit 0:
    every goal met; 1: some missed; 2: not a soak's directory."""
    from autospec.bench.soak.rejudge import NotASoak, rejudge

    try:
        result = rejudge(out)
    except NotASoak as exc:
        typer.echo(f"bench soak-report: {exc}", err=True)
        raise typer.Exit(2) from None
    before = result["rejudged"]["verdict_before"]
    typer.echo(f"report: {out / 'soak.md'} (judged again; missed before: {len(before)})")
    for line in result["verdict"]:
        typer.echo(f"MISSED: {line}")
    raise typer.Exit(1 if result["verdict"] else 0)


@bench_app.command("soak")
def soak(
    duration: Annotated[str, typer.Option(
        help="how long the traffic runs: minutes, or with a unit (90s, 45m, 2h)")] = "30",
    rate: Annotated[float, typer.Option(min=0.01, help="requests per second, constant")] = 1.0,
    engine: Annotated[str, typer.Option(help="serving engine: native or vllm")] = "native",
    target: Annotated[str, typer.Option(
        help="target: a name, a model directory or .gguf, or 'tiny' (random init, for a "
        "short run)")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="target dtype of serve and controller")] = "auto",
    out: Annotated[Path, typer.Option(help="report, logs, store and artifacts")] = Path("soak-out"),
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens per request")] = 24,
    cycle_interval: Annotated[float, typer.Option(
        min=10, help="seconds between controller cycles")] = 240.0,
    short: Annotated[bool, typer.Option(help="the short form's fault subset")] = False,
    faults: Annotated[str | None, typer.Option(
        help="only these faults, comma-separated (default: the whole schedule)")] = None,
) -> None:
    """Constant traffic through serve + controller for --duration with faults injected;
    every request, row, pointer move and process accounted for (docs/soak.md). Exit 0:
    every goal met; 1: some missed; 2: a usage error."""
    from autospec.bench.soak.cli import run_soak
    from autospec.durations import parse_span

    minutes = parse_span(duration, "--duration", "m").total_seconds() / 60
    if minutes < 1:
        raise typer.BadParameter(f"{duration!r}: a soak runs at least 1 minute",
                                 param_hint="--duration")
    checked_target(target, dtype)
    checked_out_directory(out, "--out")
    raise typer.Exit(run_soak(duration_min=minutes, rate=rate, engine=engine, target=target,
                              dtype=dtype, out=out, max_tokens=max_tokens,
                              cycle_interval_s=cycle_interval, short=short, faults=faults))

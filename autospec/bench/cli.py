"""``autospec bench ...``: benchmarks that measure side by side and report ratios."""

from __future__ import annotations

from pathlib import Path

import typer

bench_app = typer.Typer(help="Benchmarks (side by side in one process; ratios, not timings).",
                        no_args_is_help=True)


@bench_app.command("decode")
def decode(
    target: str = typer.Option("smollm2-135m", help="target: a name, a model directory or .gguf"),
    dtype: str = typer.Option("auto", help="float32, bfloat16, auto, or a comma list"),
    max_new_tokens: int = typer.Option(64, min=1, help="tokens generated per prompt"),
    k: int = typer.Option(5, min=1, help="draft tokens per step"),
    prompts: int = typer.Option(4, min=1, max=6, help="how many of the fixed prompts"),
    kinds: str = typer.Option("ngram,draft,eagle3", help="speculator kinds to run"),
    eagle3: Path | None = typer.Option(None, help="an eagle3 checkpoint directory"),
    draft: Path | None = typer.Option(None, help="a draft checkpoint directory"),
    json_path: Path | None = typer.Option(None, "--json", help="write the figures here"),
) -> None:
    """Compare HF generate, HF prompt lookup, the engine alone and with each speculator."""
    from autospec.bench.decode import run_decode_bench

    checkpoints = {name: path for name, path in (("eagle3", eagle3), ("draft", draft)) if path}
    run_decode_bench(target_spec=target, dtypes=[d.strip() for d in dtype.split(",")],
                     max_new=max_new_tokens, k=k, num_prompts=prompts,
                     kinds=[s.strip() for s in kinds.split(",") if s.strip()],
                     checkpoints=checkpoints, json_path=json_path)


@bench_app.command("store")
def store(
    database_url: str | None = typer.Option(
        None, help="database to measure (default: a temporary SQLite file, and PostgreSQL "
        "too when AUTOSPEC_TEST_POSTGRES_URL is set)"),
    rows: int = typer.Option(20000, min=100, help="request rows to ingest"),
    json_path: Path | None = typer.Option(None, "--json", help="write the figures here"),
) -> None:
    """Rows/s ingested by the traffic writer and the caller-side cost of record()."""
    from autospec.bench.store import main

    main(database_url=database_url, rows=rows, json_path=json_path)


@bench_app.command("serve")
def serve(
    target: str = typer.Option("smollm2-135m", help="target: a name, a model directory or .gguf"),
    max_tokens: int = typer.Option(32, min=1, help="tokens per request in the decode phase"),
    rounds: int = typer.Option(3, min=1, help="interleaved rounds over the configurations"),
    concurrency: int = typer.Option(2, min=1, help="concurrent clients in the decode phase"),
    short_requests: int = typer.Option(
        40, min=5, help="1-token requests per round and config in the logging phase"),
    k: int = typer.Option(5, min=1, help="draft tokens per step"),
    json_path: Path | None = typer.Option(None, "--json", help="write the figures here"),
) -> None:
    """Requests/s and p50/p99 over HTTP: logging on vs off, speculation on vs off."""
    from autospec.bench.serve import run_serve_bench

    run_serve_bench(target=target, max_tokens=max_tokens, rounds=rounds,
                    concurrency=concurrency, short_requests=short_requests, k=k,
                    json_path=json_path)


@bench_app.command("train")
def train(
    domain: str = typer.Option("support", help="workload domain: support, coding or json"),
    requests: int = typer.Option(300, min=20, help="logged requests (cached traffic)"),
    max_new_tokens: int = typer.Option(128, min=8, help="output tokens per logged request"),
    kinds: str = typer.Option("eagle3,suffix,draft", help="kinds to train and measure"),
    k: int = typer.Option(5, min=1, help="draft tokens per step"),
    epochs: int = typer.Option(16, min=1, help="training epochs (eagle3, draft)"),
    eval_requests: int = typer.Option(24, min=1, help="held-out requests decoded per method"),
    draft_vocab_size: int = typer.Option(4096, min=2, help="eagle3 reduced vocabulary"),
    ttt_steps: int = typer.Option(3, min=1, help="eagle3 training-time-test depth"),
    dtype: str = typer.Option("bfloat16", help="target dtype"),
    draft_epochs: int = typer.Option(2, min=1, help="epochs for draft"),
    feature_noise: float = typer.Option(0.2, min=0.0, help="eagle3 training feature noise"),
    workdir: Path | None = typer.Option(None, help="where the scratch store and artifacts go"),
    reuse: bool = typer.Option(False, "--reuse", help="measure candidates already trained "
                               "in --workdir instead of training them again"),
    json_path: Path | None = typer.Option(None, "--json", help="write the figures here"),
) -> None:
    """Log domain traffic, train each kind on it, measure τ and speed on held-out requests."""
    from autospec.bench.train import run_train_bench

    run_train_bench(domain=domain, requests=requests, max_new=max_new_tokens,
                    kinds=tuple(s.strip() for s in kinds.split(",") if s.strip()), k=k,
                    epochs=epochs, eval_requests=eval_requests,
                    draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, dtype=dtype,
                    draft_epochs=draft_epochs, feature_noise=feature_noise, reuse=reuse,
                    workdir=workdir,
                    json_path=json_path)

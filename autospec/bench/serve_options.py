"""``autospec bench serve``'s option checks: each refuses what the bench cannot run (a usage
error naming the option, exit 2) before anything starts."""

from __future__ import annotations

from typing import Any

import typer

#: seed of ``bench serve --domain``'s prompts: not the demo's or loadgen's default (0), so a
#: head trained on that traffic is measured on other prompts of its domain
DOMAIN_PROMPT_SEED = 7919


def checked_vllm_suffix(wanted: bool, engines: list[str]) -> bool:
    """``--vllm-suffix``: refused without the vLLM engine or without arctic-inference."""
    import importlib.util

    if not wanted:
        return False
    if "vllm" not in engines:
        raise typer.BadParameter("--vllm-suffix: needs --engine vllm")
    if importlib.util.find_spec("arctic_inference") is None:  # vLLM's suffix method needs it
        raise typer.BadParameter("--vllm-suffix: arctic-inference is not installed "
                                 "(docs/vllm.md)")
    return True


def checked_suffix_cache(cached: int | None, vllm_suffix: bool) -> int | None:
    """``--vllm-suffix-cache``: only with ``--vllm-suffix``."""
    if cached is not None and not vllm_suffix:
        raise typer.BadParameter("--vllm-suffix-cache: needs --vllm-suffix")
    return cached


def checked_suffix_warm(n: int | None, vllm_suffix: bool, database_url: str | None) -> int | None:
    """``--vllm-suffix-warm``: only with ``--vllm-suffix`` and a store of logged traffic."""
    if n is not None and (not vllm_suffix or database_url is None):
        raise typer.BadParameter("--vllm-suffix-warm: needs --vllm-suffix and --database-url "
                                 "(the store whose logged requests it replays)")
    return n


def client_counts(text: str) -> list[int]:
    """``--concurrency``'s values: positive integers, in the order given, no repeats."""
    try:
        counts = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise typer.BadParameter(f"--concurrency: {text!r} is not a list of distinct positive "
                                 "integers, e.g. 1,4,8")
    return counts


def checked_bands(text: str | None, k: int, vllm_options: dict[str, Any]) -> str | None:
    from autospec.serve.bands import BandsError, parse_bands, vllm_bands_refusal

    try:
        bands = parse_bands(text, max_k=k)
    except BandsError as exc:
        raise typer.BadParameter(f"--k-bands: {exc}") from None
    why = vllm_bands_refusal(vllm_options) if bands is not None else None
    if why is not None:
        raise typer.BadParameter(f"--k-bands: {why}")
    return None if bands is None else str(bands)


def bench_prompts(domain: str | None, count: int | None = None
                   ) -> list[list[dict[str, str]]] | None:
    """``--domain``'s prompts (``count``, default as many as the generic set), or None for the
    generic set."""
    if domain is None:
        return None
    from autospec.bench.prompts import BENCH_PROMPTS
    from autospec.workloads import UnknownDomain, domain_prompts

    try:
        return domain_prompts(domain, count or len(BENCH_PROMPTS), seed=DOMAIN_PROMPT_SEED)
    except UnknownDomain as exc:
        raise typer.BadParameter(f"--domain: {exc}") from None

"""``autospec bench serve --engine vllm --concurrency 1,4,8``: engines and loads side by side.

One local Ray Serve instance runs, for each engine named, two applications on the same
target, each its own replica: ``<engine>/spec`` (the live version of the store's
``deployment`` — ``builtin-ngram`` in the fresh store used unless ``--database-url`` names
one with a promoted head: both engines then serve that same version) and ``<engine>/off``
(speculation off); with ``--k-bands``, ``<engine>/banded``: the same version drafting by
those concurrency bands (:mod:`autospec.serve.bands`); with ``--builtin``,
``<engine>/builtin``: builtin-ngram (on vLLM its own ``ngram`` method: what a vLLM user
switches on); with ``vllm_suffix``, ``vllm/arctic``: vLLM's own ``suffix`` method (Arctic
Inference's suffix decoding, which needs the ``arctic-inference`` package; vLLM's defaults:
trees 24 deep, and a cache of the responses it served, so it also learns from the bench's
own earlier answers). Traffic logging is off in every application (this measures decoding). The same
greedy chat prompts go to every application, in interleaved rounds that rotate the order, so
drift on a shared machine hits all alike; read the ratios.

One phase per concurrency (``--concurrency 1,4,8``): that many clients, each sending its next
request when its last one is answered, at least two requests per client per batch. Per
configuration: per-request output tokens/s (completion tokens over latency, median) and
throughput (all completion tokens over the batch's wall time). The summary gives, per engine
and concurrency, speculation on over off in throughput and says where speculation stops
paying (on/off below 1); with bands, the banded deployment over off as well (the goal: never
below 1).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autospec.bench.progress import BenchProgress
from autospec.bench.prompts import BENCH_PROMPTS
from autospec.bench.serve import _batch
from autospec.engine.stats import tau
from autospec.ports import free_port
from autospec.settings import api_key

MODES = {"spec": "live", "off": "off", "banded": "live", "builtin": "live", "arctic": "live"}
#: the deployment ``builtin`` and ``arctic`` applications follow: one no version is promoted
#: in, so its replica serves builtin-ngram (on vLLM, vLLM's own ``ngram`` method)
BUILTIN_DEPLOYMENT = "autospec-bench-builtin"
#: what the ``arctic`` application's rows name as their version (its replica reports
#: builtin-ngram: vLLM's speculative config replaces that version's, engine-wide)
ARCTIC_LABEL = "vllm suffix (arctic-inference)"


def arctic_options(k: int, cached: int | None = None) -> dict[str, Any]:
    """vLLM engine arguments that make a builtin replica draft with vLLM's own ``suffix``
    method (k: the most tokens it drafts per step; ``cached``: the most served responses it
    keeps and drafts from, ``suffix_decoding_max_cached_requests`` — 0: each request's own
    prompt and output only —; vLLM's other suffix defaults)."""
    config: dict[str, Any] = {"method": "suffix", "num_speculative_tokens": k}
    if cached is not None:
        config["suffix_decoding_max_cached_requests"] = cached
    return {"speculative_config": config}


def engine_modes(engine: str, modes: list[str]) -> list[str]:
    """The applications of ``engine``: ``arctic`` is vLLM's method, served on vLLM only."""
    return [m for m in modes if m != "arctic" or engine == "vllm"]


@dataclass(frozen=True)
class Answer:
    """One response: seconds, completion tokens, the version that served it, and its
    verify steps and accepted drafts (from the ``autospec`` object)."""

    seconds: float
    tokens: int
    version: str
    steps: int
    accepted: int


def _send(session: requests.Session, url: str, body: dict[str, Any]) -> Answer:
    started = time.perf_counter()
    r = session.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    took = time.perf_counter() - started
    data = r.json()
    info = data.get("autospec") or {}
    return Answer(took, int(data["usage"]["completion_tokens"]),
                  r.headers.get("x-autospec-speculator", ""), int(info.get("num_drafts", 0)),
                  int(info.get("num_accepted_tokens", 0)))


def round_batches(bodies: list[dict[str, Any]], rounds: int, clients: int,
                  fresh: bool = False, start: int = 0) -> list[list[dict[str, Any]]]:
    """Each round's requests, at least two per client: ``bodies`` repeated as needed, the same
    every round; with ``fresh``, ``bodies`` is a pool read on from ``start``, every round taking
    prompts sent in no earlier round (:func:`fresh_pool_size` says how many are needed)."""
    if not fresh:
        return [bodies * max(1, -(-2 * clients // len(bodies)))] * rounds
    size = max(FRESH_MIN_BATCH, 2 * clients)
    batches = [bodies[start + r * size: start + (r + 1) * size] for r in range(rounds)]
    if any(len(b) < size for b in batches):
        raise ValueError(f"{len(bodies)} prompts are too few for fresh rounds "
                         f"(see fresh_pool_size)")
    return batches


#: the fewest requests of a fresh round (the fixed prompt set's size)
FRESH_MIN_BATCH = len(BENCH_PROMPTS)


def fresh_pool_size(rounds: int, clients: list[int]) -> int:
    """Prompts needed for fresh rounds at every load in ``clients``."""
    return sum(rounds * max(FRESH_MIN_BATCH, 2 * c) for c in clients)


def _phase(urls: dict[str, str], batches: list[list[dict[str, Any]]], clients: int,
           progress: BenchProgress, label: str) -> dict[str, dict[str, Any]]:
    answers: dict[str, list[Answer]] = {n: [] for n in urls}
    wall: dict[str, float] = dict.fromkeys(urls, 0.0)
    names = list(urls)
    rounds = len(batches)
    for r, batch in enumerate(batches):
        for name in names[r % len(names):] + names[: r % len(names)]:
            got, took = _batch(urls[name], batch, clients, _send)
            answers[name] += got
            wall[name] += took
            progress.done(f"{label} round {r + 1}/{rounds} {name}: {len(got)} requests, "
                          f"{sum(a.tokens for a in got) / took:.1f} tok/s")
    figures = {n: _figures(answers[n], wall[n]) for n in names}
    for name in names:
        if name.endswith("/arctic"):
            figures[name]["versions"] = [ARCTIC_LABEL]
    return figures


def measure_loads(urls: dict[str, str], bodies: list[dict[str, Any]], rounds: int,
                  clients: list[int], progress: BenchProgress,
                  fresh: bool = False) -> dict[int, dict[str, Any]]:
    """One phase per concurrency in ``clients`` over the applications at ``urls`` (name →
    URL, e.g. ``vllm/spec``, ``vllm/off``): ``rounds`` interleaved rounds of ``bodies`` each
    (with ``fresh``, of prompts no round sent before: :func:`round_batches`); per application
    its figures (:func:`_figures`), kept in ``progress``'s report as they come.
    ``autospec bench serve --engine`` and the demo on vLLM both measure with it."""
    phases: dict[int, dict[str, Any]] = {}
    start = 0
    for c in clients:
        batches = round_batches(bodies, rounds, c, fresh, start)
        start += sum(map(len, batches)) if fresh else 0
        with progress.stage(f"{c} client{'s' * (c > 1)}: {rounds} rounds"):
            phases[c] = _phase(urls, batches, c, progress, f"{c} clients")
            progress.report.setdefault("phases", {})[str(c)] = phases[c]
    return phases


def _figures(answers: list[Answer], wall_s: float) -> dict[str, Any]:
    """A configuration's figures: per-request tokens/s (median), throughput, versions and τ
    over all its requests' steps (1.0 without speculation; None without any step)."""
    return {"requests": len(answers),
            "per_request_tok_s": statistics.median(a.tokens / a.seconds for a in answers
                                                   if a.seconds > 0),
            "throughput_tok_s": sum(a.tokens for a in answers) / wall_s,
            "versions": sorted({a.version for a in answers}),
            "tau": tau(sum(a.accepted for a in answers), sum(a.steps for a in answers))}


def _deploy(engines: list[str], modes: list[str], target: str, dtype: str, url: str,
            deployment: str, data_dir: Path, k: int, k_bands: str | None,
            vllm_options: dict[str, Any], arctic_cached: int | None = None) -> dict[str, str]:
    from ray import serve

    from autospec.raylocal import start_local
    from autospec.serve.app import build_app

    port = free_port()
    start_local(num_cpus=2 * len(engines) * len(modes), log_to_driver=False,
                namespace="autospec-bench-engines")  # on loopback: autospec.raylocal
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    env = {"AUTOSPEC_DATA_DIR": str(data_dir)}
    urls = {}
    for engine in engines:
        for mode in engine_modes(engine, modes):
            route = f"{engine}-{mode}"
            options = {**vllm_options,
                       **(arctic_options(k, arctic_cached) if mode == "arctic" else {})}
            serve.run(build_app({
                "target": target, "dtype": dtype, "database_url": url, "speculator_k": k,
                "deployment": BUILTIN_DEPLOYMENT if mode in ("builtin", "arctic")
                else deployment,
                "engine": engine, "speculation": MODES[mode],
                "k_bands": k_bands if mode == "banded" else None,
                "log_traffic": False, "vllm_options": options, "api_key": api_key(),
                "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": env}}}),
                name=route, route_prefix=f"/{route}")
            urls[f"{engine}/{mode}"] = f"http://127.0.0.1:{port}/{route}"
    return urls


def run_engine_bench(*, engines: list[str], target: str, dtype: str, max_tokens: int,
                     rounds: int, clients: list[int], k: int, database_url: str | None,
                     deployment: str, json_path: Path | None, k_bands: str | None = None,
                     prompts: list[list[dict[str, str]]] | None = None,
                     vllm_options: dict[str, Any] | None = None,
                     builtin: bool = False, vllm_suffix: bool = False,
                     vllm_suffix_cached: int | None = None,
                     vllm_suffix_warm: int | None = None,
                     fresh_prompts: bool = False) -> dict[str, Any]:
    """Deploy every engine × {spec, off[, banded][, builtin][, arctic]}, measure one phase
    per concurrency in ``clients``, print, write the JSON; ``prompts``: the chats sent
    (default: the generic benchmark prompts); ``vllm_options``: vLLM engine arguments
    (max_model_len 2048 unless set); ``builtin``: also an application serving builtin-ngram
    (vLLM's ``ngram``), what a vLLM user gets by switching on a built-in method;
    ``vllm_suffix``: also, on vLLM, vLLM's own ``suffix`` method (needs arctic-inference),
    keeping at most ``vllm_suffix_cached`` served responses to draft from (None: vLLM's
    default), first shown the store's newest ``vllm_suffix_warm`` logged requests
    (:mod:`autospec.bench.arctic_warm`); ``fresh_prompts``: ``prompts`` is a pool of at least
    :func:`fresh_pool_size` chats and no round repeats one (:func:`round_batches`)."""
    from ray import serve

    from autospec import store

    modes = ["spec", "off"] + (["banded"] if k_bands else []) + (["builtin"] if builtin else []) \
        + (["arctic"] if vllm_suffix else [])
    partial: dict[str, Any] = {"target": target, "engines": engines, "clients": clients}
    progress = BenchProgress("bench serve --engine", partial, json_path)
    with tempfile.TemporaryDirectory(prefix="autospec-bench-engines-") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'autospec.db'}"
        if database_url is None:
            store.open_store(url, upgrade=True).dispose()
        apps = sum(len(engine_modes(e, modes)) for e in engines)
        with progress.stage(f"deploying {apps} applications of {target}"):
            urls = _deploy(engines, modes, target, dtype, url, deployment, Path(tmp), k, k_bands,
                           {"max_model_len": 2048, **(vllm_options or {})},
                           vllm_suffix_cached)
        try:
            bodies = [{"messages": m, "max_tokens": max_tokens, "temperature": 0}
                      for m in (prompts or BENCH_PROMPTS)]
            if vllm_suffix and vllm_suffix_warm:
                from autospec.bench.arctic_warm import warm, warm_bodies

                partial["vllm_suffix_warm"] = warm(urls["vllm/arctic"],
                                                   warm_bodies(url, vllm_suffix_warm), progress)
            with progress.stage("warm-up"):
                warm_up = [{**bodies[0], "messages": m} for m in BENCH_PROMPTS[:2]] \
                    if fresh_prompts else bodies[:2]  # fresh: no measured prompt seen before
                _phase(urls, [warm_up], 1, progress, "warm-up")
            phases = measure_loads(urls, bodies, rounds, clients, progress, fresh_prompts)
        finally:
            serve.shutdown()
    result = _summarize(engines, modes, target, dtype, max_tokens, k, k_bands, phases)
    result["vllm_options"] = vllm_options or {}
    result["fresh_prompts"] = fresh_prompts
    result["vllm_suffix_warm"] = partial.get("vllm_suffix_warm")
    if vllm_suffix:
        result["vllm_suffix_options"] = arctic_options(k, vllm_suffix_cached)["speculative_config"]
    partial.update(result)
    progress.finish()
    _print(result)
    return result


def _summarize(engines: list[str], modes: list[str], target: str, dtype: str, max_tokens: int,
               k: int, k_bands: str | None,
               phases: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per engine and concurrency: throughput ratios over target-only; where speculation
    stops paying (the lowest concurrency at which spec/off < 1, None: nowhere measured)."""
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for e in engines:
        ratios[e] = {}
        for c, phase in phases.items():
            off = phase[f"{e}/off"]["throughput_tok_s"]
            ratios[e][str(c)] = {m: phase[f"{e}/{m}"]["throughput_tok_s"] / off
                                 for m in engine_modes(e, modes) if m != "off"}
    stops = {e: min((int(c) for c, r in ratios[e].items() if r["spec"] < 1.0), default=None)
             for e in engines}
    result: dict[str, Any] = {
        "target": target, "dtype": dtype, "max_tokens": max_tokens, "k": k, "k_bands": k_bands,
        "clients": sorted(phases), "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "phases": {str(c): p for c, p in phases.items()}, "ratios": ratios,
        "speculation_stops_paying_at": stops}
    if "banded" in modes:
        result["banded_never_slower"] = {e: all(r["banded"] >= 1.0 for r in ratios[e].values())
                                         for e in engines}
    if "builtin" in modes:
        result["live_over_builtin"] = {
            e: {c: r["spec"] / r["builtin"] for c, r in ratios[e].items()} for e in engines}
    if "arctic" in modes and "vllm" in engines:
        result["live_over_vllm_suffix"] = {
            c: r["spec"] / r["arctic"] for c, r in ratios["vllm"].items()}
    if {"vllm", "native"} <= set(engines):
        result["vllm_over_native"] = {
            str(c): {m: p[f"vllm/{m}"]["throughput_tok_s"] / p[f"native/{m}"]["throughput_tok_s"]
                     for m in engine_modes("native", modes)} for c, p in phases.items()}
    return result


def _print(result: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=Text(f"bench serve --engine ({result['target']}, {result['dtype']}, "
                             f"{result['max_tokens']} tokens, k={result['k']}"
                             + (f", bands {result['k_bands']}" if result["k_bands"] else "")
                             + ")", style="table.title"))
    for col in ("engine/speculation", "clients", "version", "τ", "tok/s per request",
                "throughput tok/s", "÷ off"):
        table.add_column(col, justify="left" if col in ("engine/speculation", "version")
                         else "right")
    for c, phase in result["phases"].items():
        for name, row in phase.items():
            engine, mode = name.split("/")
            ratio = result["ratios"][engine][c].get(mode)
            shown = "—" if row["tau"] is None else f"{row['tau']:.2f}"
            table.add_row(*map(Text, (name, c, ",".join(row["versions"]), shown,
                                      f"{row['per_request_tok_s']:.1f}",
                                      f"{row['throughput_tok_s']:.1f}",
                                      "—" if ratio is None else f"{ratio:.2f}×")))
    console.print(table)
    for engine, at in result["speculation_stops_paying_at"].items():
        console.print(Text(f"{engine}: speculation " + (
            f"stops paying at {at} clients" if at is not None else
            f"pays at every load measured ({', '.join(map(str, result['clients']))} clients)")))
    for engine, by_c in result.get("live_over_builtin", {}).items():
        console.print(Text(f"{engine}: the live version over builtin-ngram: " + ", ".join(
            f"{r:.2f}× at {c}" for c, r in by_c.items())))
    if "live_over_vllm_suffix" in result:
        cached = result.get("vllm_suffix_options", {}).get(
            "suffix_decoding_max_cached_requests", "vLLM's default number of")
        console.print(Text(f"vllm: the live version over vLLM's suffix (arctic-inference, "
                           f"caching {cached} served responses): " + ", ".join(
            f"{r:.2f}× at {c}" for c, r in result["live_over_vllm_suffix"].items())))
    for engine, ok in result.get("banded_never_slower", {}).items():
        console.print(Text.assemble(f"{engine}: with bands {result['k_bands']} the deployment "
                                    "is ", ("never slower than target-only", "") if ok else
                                    ("slower than target-only at some load", "red")))

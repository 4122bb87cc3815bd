"""``autospec bench serve --engine vllm,native``: the serving engines side by side over HTTP.

One local Ray Serve instance runs, for each engine named, two applications on the same
target, each its own replica: ``<engine>/spec`` (the live version of the store's
``deployment`` — ``builtin-ngram`` in the fresh store used unless ``--database-url`` names
one with a promoted head: both engines then serve that same version) and ``<engine>/off``
(speculation off). Traffic logging is off in every application (this measures decoding).
The same greedy chat prompts go to every application, in interleaved rounds that rotate the
order, so drift on a shared machine hits all alike; read the ratios.

Two phases: ``1 client`` (per-request output tokens/s: completion tokens over latency,
median over requests) and ``N clients`` (throughput: all completion tokens over the wall
time of the batch). Ratios: vLLM over native per request and at N clients (speculation on),
speculation on over off per engine.
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

from autospec.bench.progress import BenchProgress
from autospec.bench.prompts import BENCH_PROMPTS
from autospec.bench.serve import _batch, _free_port
from autospec.settings import api_key

MODES = {"spec": "live", "off": "off"}


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


def _phase(urls: dict[str, str], bodies: list[dict[str, Any]], rounds: int, clients: int,
           progress: BenchProgress, label: str) -> dict[str, dict[str, Any]]:
    answers: dict[str, list[Answer]] = {n: [] for n in urls}
    wall: dict[str, float] = dict.fromkeys(urls, 0.0)
    names = list(urls)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            got, took = _batch(urls[name], bodies, clients, _send)
            answers[name] += got
            wall[name] += took
            progress.done(f"{label} round {r + 1}/{rounds} {name}: "
                          f"{sum(a.tokens for a in got) / took:.1f} tok/s")
    return {n: _figures(answers[n], wall[n]) for n in names}


def _figures(answers: list[Answer], wall_s: float) -> dict[str, Any]:
    """A configuration's figures: per-request tokens/s (median), throughput, versions and τ
    over all its requests' steps (1.0: no speculation)."""
    steps = sum(a.steps for a in answers)
    return {"requests": len(answers),
            "per_request_tok_s": statistics.median(a.tokens / a.seconds for a in answers
                                                   if a.seconds > 0),
            "throughput_tok_s": sum(a.tokens for a in answers) / wall_s,
            "versions": sorted({a.version for a in answers}),
            "tau": (sum(a.accepted for a in answers) + steps) / steps if steps else 1.0}


def _deploy(engines: list[str], target: str, dtype: str, url: str, deployment: str,
            data_dir: Path, k: int, vllm_options: dict[str, Any]) -> dict[str, str]:
    import ray
    from ray import serve

    from autospec.serve.app import build_app

    port = _free_port()
    ray.init(address="local", num_cpus=2 * len(engines) * len(MODES), include_dashboard=False,
             log_to_driver=False, namespace="autospec-bench-engines")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    env = {"AUTOSPEC_DATA_DIR": str(data_dir)}
    urls = {}
    for engine in engines:
        for mode, speculation in MODES.items():
            route = f"{engine}-{mode}"
            serve.run(build_app({
                "target": target, "dtype": dtype, "database_url": url, "speculator_k": k,
                "deployment": deployment, "engine": engine, "speculation": speculation,
                "log_traffic": False, "vllm_options": vllm_options, "api_key": api_key(),
                "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": env}}}),
                name=route, route_prefix=f"/{route}")
            urls[f"{engine}/{mode}"] = f"http://127.0.0.1:{port}/{route}"
    return urls


def run_engine_bench(*, engines: list[str], target: str, dtype: str, max_tokens: int,
                     rounds: int, clients: int, k: int, database_url: str | None,
                     deployment: str, json_path: Path | None,
                     prompts: list[list[dict[str, str]]] | None = None) -> dict[str, Any]:
    """Deploy every engine × {spec, off}, measure both phases, print, write the JSON;
    ``prompts``: the chats sent (default: the generic benchmark prompts)."""
    from ray import serve

    from autospec import store

    partial: dict[str, Any] = {"target": target, "engines": engines}
    progress = BenchProgress("bench serve --engine", partial, json_path)
    with tempfile.TemporaryDirectory(prefix="autospec-bench-engines-") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'autospec.db'}"
        if database_url is None:
            store.open_store(url, upgrade=True).dispose()
        with progress.stage(f"deploying {len(engines) * len(MODES)} applications of {target}"):
            urls = _deploy(engines, target, dtype, url, deployment, Path(tmp), k,
                           {"max_model_len": 2048})
        try:
            bodies = [{"messages": m, "max_tokens": max_tokens, "temperature": 0}
                      for m in (prompts or BENCH_PROMPTS)]
            with progress.stage("warm-up"):
                _phase(urls, bodies[:2], 1, 1, progress, "warm-up")
            with progress.stage(f"1 client: {rounds} rounds"):
                single = _phase(urls, bodies, rounds, 1, progress, "1 client")
            with progress.stage(f"{clients} clients: {rounds} rounds"):
                many = _phase(urls, bodies * max(1, clients // 2), rounds, clients, progress,
                              f"{clients} clients")
        finally:
            serve.shutdown()
    result = _summarize(engines, target, dtype, max_tokens, clients, k, single, many)
    partial.update(result)
    progress.finish()
    _print(result)
    return result


def _summarize(engines: list[str], target: str, dtype: str, max_tokens: int, clients: int,
               k: int, single: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    ratios: dict[str, float] = {}
    for e in engines:
        ratios[f"{e}: spec/off per request"] = (single[f"{e}/spec"]["per_request_tok_s"]
                                                / single[f"{e}/off"]["per_request_tok_s"])
        ratios[f"{e}: spec/off throughput"] = (many[f"{e}/spec"]["throughput_tok_s"]
                                               / many[f"{e}/off"]["throughput_tok_s"])
    if {"vllm", "native"} <= set(engines):
        for mode in MODES:
            ratios[f"vllm/native per request ({mode})"] = (
                single[f"vllm/{mode}"]["per_request_tok_s"]
                / single[f"native/{mode}"]["per_request_tok_s"])
            ratios[f"vllm/native throughput ({mode})"] = (
                many[f"vllm/{mode}"]["throughput_tok_s"]
                / many[f"native/{mode}"]["throughput_tok_s"])
    return {"target": target, "dtype": dtype, "max_tokens": max_tokens, "clients": clients,
            "k": k, "cpus": os.cpu_count(), "single": single, "many": many, "ratios": ratios}


def _print(result: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"bench serve --engine ({result['target']}, {result['dtype']}, "
                  f"{result['max_tokens']} tokens, k={result['k']})")
    for col in ("engine/speculation", "version", "τ", "1 client tok/s per request",
                f"{result['clients']} clients tok/s"):
        table.add_column(col, justify="left" if col in ("engine/speculation", "version")
                         else "right")
    for name, row in result["single"].items():
        table.add_row(name, ",".join(row["versions"]), f"{row['tau']:.2f}",
                      f"{row['per_request_tok_s']:.1f}",
                      f"{result['many'][name]['throughput_tok_s']:.1f}")
    console.print(table)
    for name, value in result["ratios"].items():
        console.print(f"{name}: {value:.2f}×")

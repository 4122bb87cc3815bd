"""Does the gate's speed projection carry from the prompts it decodes to the held-out set?

The gate decodes a few held-out prompts (target-only and each version, interleaved) and
projects the speedup over every held-out request from the replay: τ ÷ the cost of a
speculative step. An index drafts as much as it matches, so the prompts it matches best
have dearer steps; this check measures how well each way of pricing a step predicts the
decoded speedup of *other* prompts:

- ``prompts' step cost``: τ ÷ the median step cost of the rounds (the gate before
  2026-12-05);
- ``at replayed drafts``: τ ÷ (1 + c·d), c a drafted token's cost from the same rounds, d
  the drafts per step replayed on the prompts predicted
  (:meth:`autospec.evaluate.speed.SpeedMeasurement.projected`, the gate now).

A suffix index is built from greedy traffic of two domains (the target's own outputs); each
domain's held-out prompts are measured as the gate measures (``--engine native``: one at a
time on this process's torch threads; ``--engine vllm``: batches of ``--concurrency``), and
each domain's measurement predicts the other's decoded speedup (median of its rounds' ratios)
from the other's replayed τ and drafts per step. Prints the errors; ``--json`` writes them.

    python scripts/step_cost_check.py --engine vllm --domains json,support --json out.json

About 4 minutes on vLLM and 7 on the native engine (1 thread) on 2 CPU cores, default target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERSION = "suffix"


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def greedy_outputs(target: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt (autospec's engine)."""
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.sampling import SamplingParams

    engine = SpeculativeEngine(target)
    return [engine.generate(p, SamplingParams(max_new_tokens=max_new)).token_ids
            for p in prompts]


def measure(target: Any, spec: Any, prompts: list[list[int]], args: argparse.Namespace) -> Any:
    """The gate's speed measurement of ``spec`` on ``prompts`` (see module doc)."""
    if args.engine == "vllm":
        from autospec.evaluate.speed_vllm import measure_speedups_vllm

        return measure_speedups_vllm(target, {VERSION: ("suffix", spec)}, prompts, k=args.k,
                                     concurrency=args.concurrency, max_tokens=args.max_tokens,
                                     repeats=args.repeats, options=args.options)
    from autospec.evaluate.speed import measure_speedups

    return measure_speedups(target, {VERSION: spec}, prompts, k=args.k,
                            max_tokens=args.max_tokens, repeats=args.repeats)


def check(target: Any, prompts: dict[str, list[list[int]]], args: argparse.Namespace,
          progress: Callable[[str], None] = say) -> dict[str, Any]:
    """The check of the module doc on ``prompts`` (domain -> token ids): the first
    ``args.train`` of each domain build the index, the next ``args.heldout`` are measured."""
    from autospec.engine.sampling import SamplingParams
    from autospec.evaluate.compare import drafts_per_step, set_tau
    from autospec.evaluate.replay import ReplayRequest, replay
    from autospec.speculators.registry import new_speculator
    from autospec.speculators.suffix import suffix_from_documents

    need = args.train + args.heldout
    outputs = {d: greedy_outputs(target, ps[:need], args.train_tokens)
               for d, ps in prompts.items()}
    progress(f"traffic: {need} greedy requests per domain, {args.train_tokens} tokens each")
    docs = [(p, o) for d, ps in prompts.items()
            for p, o in zip(ps[:args.train], outputs[d][:args.train], strict=True)]
    spec = suffix_from_documents(new_speculator("suffix", target).config, docs, target)
    replayed, measured = {}, {}
    for d, ps in prompts.items():
        held = ps[args.train:need]
        params = SamplingParams(max_new_tokens=args.max_tokens)
        reqs = [ReplayRequest(p, o[:args.max_tokens], params)
                for p, o in zip(held, outputs[d][args.train:need], strict=True)]
        stats = replay(target, {VERSION: spec}, reqs, args.k)[VERSION]
        replayed[d] = {"tau": set_tau(stats), "drafts_per_step": drafts_per_step(stats)}
        progress(f"{d}: replayed τ {replayed[d]['tau']:.3f}, "
                 f"{replayed[d]['drafts_per_step']:.2f} drafts a step; measuring speed")
        measured[d] = measure(target, spec, held, args)
    return {"replayed": replayed,
            "measured": {d: _measured(m) for d, m in measured.items()},
            "predictions": [_predict(measured[src], replayed[dst], measured[dst], src, dst)
                            for src in prompts for dst in prompts if src != dst]}


def _measured(m: Any) -> dict[str, Any]:
    return {"decoded": m.speedup[VERSION], "step_cost": m.step_cost[VERSION],
            "draft_cost": m.draft_cost.get(VERSION),
            "drafts_per_step": m.drafts_per_step.get(VERSION), "ratios": m.ratios[VERSION],
            "engine": m.engine, "concurrency": m.concurrency, "rounds": m.rounds}


def _predict(m: Any, replayed: dict[str, Any], truth: Any, src: str,
             dst: str) -> dict[str, Any]:
    tau, drafts = replayed["tau"], replayed["drafts_per_step"]
    decoded = truth.speedup[VERSION]
    old = tau / m.step_cost[VERSION]
    new = m.projected({VERSION: tau}, {VERSION: drafts})[VERSION]
    return {"measured_on": src, "predicted": dst, "decoded": decoded,
            "prompts_step_cost": old, "at_replayed_drafts": new,
            "error_prompts_step_cost": old / decoded - 1,
            "error_at_replayed_drafts": new / decoded - 1}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m", help="target: a name or directory")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="target dtype (float32: replay equals the engine's acceptance)")
    p.add_argument("--engine", choices=["native", "vllm"], default="vllm",
                   help="the engine the rounds are timed on")
    p.add_argument("--domains", default="json,support",
                   help="two or three of support, coding, json")
    p.add_argument("--train", type=int, default=24, help="requests per domain indexed")
    p.add_argument("--heldout", type=int, default=8, help="held-out prompts per domain")
    p.add_argument("--train-tokens", type=int, default=64, help="tokens per indexed request")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per timed decode")
    p.add_argument("--k", type=int, default=5, help="draft tokens per step")
    p.add_argument("--concurrency", type=int, default=4, help="vLLM: requests at once")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per prompt set")
    p.add_argument("--seed", type=int, default=1, help="which prompts each domain draws")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    args = p.parse_args()
    from autospec.workloads import DOMAINS

    domains = args.domains.split(",")
    unknown = sorted(set(domains) - set(DOMAINS))
    if unknown or not 2 <= len(set(domains)) <= 3:
        p.error(f"--domains: give two or three of {', '.join(sorted(DOMAINS))}"
                + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    args.options = {"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}

    from autospec.engine.target import load_target
    from autospec.workloads import domain_prompts

    started = time.perf_counter()
    target = load_target(args.target, dtype=args.dtype)
    prompts = {d: [target.encode_chat(c) for c in domain_prompts(
        d, args.train + args.heldout, args.seed)] for d in domains}
    report = check(target, prompts, args,
                   lambda text: say(f"[{time.perf_counter() - started:6.0f} s] {text}"))
    for row in report["predictions"]:
        say(f"measured on {row['measured_on']}, predicting {row['predicted']} (decoded "
            f"{row['decoded']:.3f}×): prompts' step cost {row['prompts_step_cost']:.3f}× "
            f"({row['error_prompts_step_cost']:+.1%}), at replayed drafts "
            f"{row['at_replayed_drafts']:.3f}× ({row['error_at_replayed_drafts']:+.1%})")
    report["args"] = {k: v for k, v in vars(args).items() if k != "json"}
    report["loadavg"] = Path("/proc/loadavg").read_text().strip()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

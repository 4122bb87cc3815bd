"""``autospec bench decode``: every decoding method side by side, in one process.

All runs use the same target, prompts and greedy settings. Speedup is against the
engine's own target-only run; "lossless" means output identical, token for token, to
the engine's target-only output. Also measures the cost of verifying ``n`` tokens in
one target forward against a 1-token step, for each dtype asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from autospec.bench.progress import BenchProgress
from autospec.bench.prompts import BENCH_PROMPTS
from autospec.engine.clock import clock
from autospec.engine.costs import verify_cost
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.reference import OracleSpeculator
from autospec.engine.sampling import SamplingParams
from autospec.engine.stats import tau
from autospec.engine.target import Target, load_target

log = logging.getLogger(__name__)


@dataclass
class Run:
    name: str
    tokens_per_s: float
    tau: float | None  # None: not measured (Hugging Face generate), or no step was taken
    speedup: float = 0.0
    lossless: bool = True
    agreement: float = 1.0  # fraction of prompts whose output equals target-only
    divergences: list[dict] = field(default_factory=list)  # first mismatch per prompt
    outputs: list[list[int]] = field(default_factory=list, repr=False)


def hf_generate(target: Target, prompts: list[list[int]], max_new: int,
                lookup: int = 0) -> Run:
    """Hugging Face ``generate`` (greedy), optionally with prompt-lookup decoding."""
    kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    outputs, total_tokens, total_s = [], 0, 0.0
    for ids in prompts:
        inp = torch.tensor([ids], device=target.device)
        started = clock(target.device)
        with torch.inference_mode():
            out = target.model.generate(inp, attention_mask=torch.ones_like(inp),
                                        max_new_tokens=max_new, do_sample=False,
                                        pad_token_id=target.info.eos_token_ids[0], **kwargs)
        total_s += clock(target.device) - started
        new = out[0, len(ids):].tolist()
        outputs.append(new)
        total_tokens += len(new)
    name = f"hf-generate-prompt-lookup(k={lookup})" if lookup else "hf-generate"
    return Run(name=name, tokens_per_s=total_tokens / total_s, tau=None, outputs=outputs)


def engine_run(name: str, engine: SpeculativeEngine, prompts: list[list[int]],
               max_new: int) -> Run:
    params = SamplingParams(max_new_tokens=max_new)
    outputs, tokens, seconds, steps, accepted = [], 0, 0.0, 0, 0
    for ids in prompts:
        res = engine.generate(ids, params)
        outputs.append(res.token_ids)
        tokens += res.stats.output_tokens
        seconds += res.stats.total_s
        steps += res.stats.num_drafts
        accepted += res.stats.num_accepted_tokens
    return Run(name=name, tokens_per_s=tokens / seconds, tau=tau(accepted, steps),
               outputs=outputs)


def compare(run: Run, baseline: Run, target: Target, prompts: list[list[int]]) -> None:
    """Fill speedup, agreement and, for each mismatch, the target's top-2 margin there."""
    run.speedup = run.tokens_per_s / baseline.tokens_per_s
    same = 0
    for ids, got, want in zip(prompts, run.outputs, baseline.outputs, strict=True):
        if _same_up_to_eos(got, want):
            same += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                  min(len(got), len(want)))
        run.divergences.append({"position": at, **near_tie(target, ids + want[:at])})
    run.agreement = same / len(prompts)
    run.lossless = same == len(prompts)


def _same_up_to_eos(a: list[int], b: list[int]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n] and abs(len(a) - len(b)) <= 1  # HF drops nothing; EOS may differ


@torch.inference_mode()
def near_tie(target: Target, context: list[int]) -> dict:
    """Top-2 logit margin of the target's next token after ``context`` and its dtype's ulp."""
    logits = target.model(torch.tensor([context], device=target.device)).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    margin = float(top[0] - top[1])
    mantissa = 7 if target.dtype == torch.bfloat16 else 23
    ulp = 2.0 ** (torch.floor(torch.log2(top[0].abs().clamp_min(1e-6))).item() - mantissa)
    return {"margin": margin, "ulp": ulp, "near_tie": margin <= 4 * ulp}


def build_runs(target: Target, prompts: list[list[int]], max_new: int, k: int,
               kinds: list[str], checkpoints: dict[str, Path],
               on_run: Callable[[Run], None] = lambda run: None) -> list[Run]:
    """Every method, the engine's target-only run first (the baseline of the others);
    ``on_run`` sees each run as soon as it is measured and compared."""
    from autospec.speculators import registry
    from autospec.speculators.checkpoint import load_speculator
    from autospec.speculators.registry import new_speculator

    # warm-up of both paths: one-time kernel, allocator and (on GPUs) clock ramp-up costs
    # must not land on the first run timed, the baseline of all others
    hf_generate(target, prompts[:1], 4)
    engine_run("warm-up", SpeculativeEngine(target), prompts[:1], min(max_new, 16))
    base = engine_run("engine-target-only", SpeculativeEngine(target), prompts, max_new)
    runs: list[Run] = []

    def finished(run: Run) -> None:
        compare(run, base, target, prompts)
        runs.append(run)
        on_run(run)

    finished(base)
    finished(hf_generate(target, prompts, max_new))
    finished(hf_generate(target, prompts, max_new, k))
    for kind in kinds:
        if kind in checkpoints:
            spec, label = load_speculator(checkpoints[kind], target), f"engine+{kind}(ckpt)"
        else:
            spec, label = new_speculator(kind, target), f"engine+{kind}(untrained)"
        if not registry.kind(kind).trainable:  # nothing to train: not "untrained"
            label = f"engine+{kind}"
        finished(engine_run(f"{label}(k={k})", SpeculativeEngine(target, spec, k),
                            prompts, max_new))
    oracle = _OracleForPrompts(base.outputs)
    finished(engine_run(f"engine+oracle(k={k})", oracle.engine(target, k), prompts, max_new))
    return runs


class _OracleForPrompts:
    """An oracle that knows the target-only output of each prompt, in order."""

    def __init__(self, outputs: list[list[int]]) -> None:
        self.outputs = outputs

    def engine(self, target: Target, k: int) -> SpeculativeEngine:
        spec = OracleSpeculator([])
        engine = SpeculativeEngine(target, spec, k)
        outputs = iter(self.outputs)
        begin = spec.begin

        def begin_next(prompt_ids, features):
            spec.continuation = next(outputs)
            begin(prompt_ids, features)

        spec.begin = begin_next  # type: ignore[method-assign]
        return engine


def run_decode_bench(*, target_spec: str, dtypes: list[str], max_new: int, k: int,
                     num_prompts: int, kinds: list[str], checkpoints: dict[str, Path],
                     json_path: Path | None) -> dict:
    """Each dtype in turn; every run printed as a line and saved to ``json_path`` as it
    finishes, the tables at the end of each dtype."""
    from autospec.bench.report import print_decode_report

    report: dict = {"target": target_spec, "k": k, "max_new_tokens": max_new, "by_dtype": {}}
    progress = BenchProgress("bench decode", report, json_path)
    for dtype in dtypes:
        with progress.stage(f"loading {target_spec} ({dtype})"):
            target = load_target(target_spec, dtype=dtype)
        name = str(target.dtype).removeprefix("torch.")
        section: dict = {"dtype": name, "runs": []}
        report["by_dtype"][name] = section
        report.setdefault("runs", section["runs"])  # the first dtype's, as before

        def on_run(run: Run, section: dict = section) -> None:
            section["runs"].append(_public(run))
            shown = "" if run.tau is None else f", τ {run.tau:.2f}"
            progress.done(f"{section['dtype']} {run.name}: {run.tokens_per_s:.1f} tokens/s"
                          f"{shown}, {run.speedup:.2f}× speed, "
                          f"{'lossless' if run.lossless else 'NOT lossless'}")

        prompts = [target.encode_chat(m) for m in BENCH_PROMPTS[:num_prompts]]
        with progress.stage(f"{name}: {len(prompts)} prompts × {max_new} tokens, each method"):
            build_runs(target, prompts, max_new, k, kinds, checkpoints, on_run)
        with progress.stage(f"{name}: target forward cost of n tokens"):
            cost = verify_cost(target)
        section["verify_cost_ms"] = {n: s * 1000 for n, s in cost.items()}
        section["verify_cost_ratio"] = {n: s / cost[1] for n, s in cost.items()}
        progress.done(f"{name} verify cost: " + ", ".join(
            f"n={n} {r:.2f}×" for n, r in section["verify_cost_ratio"].items()))
        print_decode_report(section)
    progress.finish()
    return report


def _public(run: Run) -> dict:
    data = asdict(run)
    data.pop("outputs")
    return data

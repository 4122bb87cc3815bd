"""``autospec bench decode``: every decoding method side by side, in one process.

All runs use the same target, prompts and greedy settings, interleaved: each prompt is
decoded by every method in turn, the order reversed every other prompt. Speedup is against the
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
    outputs, total_tokens, total_s = [], 0, 0.0
    for ids in prompts:
        new, seconds = _hf_one(target, ids, max_new, lookup)
        total_s += seconds
        outputs.append(new)
        total_tokens += len(new)
    return Run(name=_hf_name(lookup), tokens_per_s=total_tokens / total_s, tau=None,
               outputs=outputs)


def _hf_name(lookup: int) -> str:
    return f"hf-generate-prompt-lookup(k={lookup})" if lookup else "hf-generate"


def _hf_one(target: Target, ids: list[int], max_new: int, lookup: int) -> tuple[list[int], float]:
    kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    inp = torch.tensor([ids], device=target.device)
    started = clock(target.device)
    with torch.inference_mode():
        out = target.model.generate(inp, attention_mask=torch.ones_like(inp),
                                    max_new_tokens=max_new, do_sample=False,
                                    pad_token_id=target.info.eos_token_ids[0], **kwargs)
    return out[0, len(ids):].tolist(), clock(target.device) - started


def engine_run(name: str, engine: SpeculativeEngine, prompts: list[list[int]],
               max_new: int) -> Run:
    tally = _Tally(name)
    for ids in prompts:
        tally.add(_engine_one(engine, ids, max_new))
    return tally.run()


#: one prompt's decode: (output ids, tokens, seconds, steps — None: not counted —, accepted)
Decoded = tuple[list[int], int, float, int | None, int]


def _engine_one(engine: SpeculativeEngine, ids: list[int], max_new: int) -> Decoded:
    res = engine.generate(ids, SamplingParams(max_new_tokens=max_new))
    s = res.stats
    return res.token_ids, s.output_tokens, s.total_s, s.num_drafts, s.num_accepted_tokens


@dataclass
class _Tally:
    """One method's decodes so far."""

    name: str
    outputs: list[list[int]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    steps: int | None = 0
    accepted: int = 0

    def add(self, decoded: Decoded) -> None:
        out, tokens, seconds, steps, accepted = decoded
        self.outputs.append(out)
        self.tokens += tokens
        self.seconds += seconds
        self.steps = None if steps is None or self.steps is None else self.steps + steps
        self.accepted += accepted

    def run(self) -> Run:
        return Run(name=self.name, tokens_per_s=self.tokens / self.seconds,
                   tau=None if self.steps is None else tau(self.accepted, self.steps),
                   outputs=list(self.outputs))


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


#: a method: its name and its decode of prompt ``i`` (``ids``)
Method = tuple[str, Callable[[int, list[int]], Decoded]]
TARGET_ONLY = "engine-target-only"


def build_runs(target: Target, prompts: list[list[int]], max_new: int, k: int,
               kinds: list[str], checkpoints: dict[str, Path],
               on_round: Callable[[int, list[Run]], None] = lambda n, runs: None) -> list[Run]:
    """Every method side by side: prompt by prompt, each method decodes the prompt in turn,
    the order reversed every other prompt (so load drift on the machine lands on every
    method alike); the oracle goes last in each round, as it replays that round's
    target-only output. ``on_round(prompts_done, runs so far)`` after each prompt."""
    # warm-up of both paths: one-time kernel, allocator and (on GPUs) clock ramp-up costs
    # must not land on the first decodes timed
    hf_generate(target, prompts[:1], 4)
    engine_run("warm-up", SpeculativeEngine(target), prompts[:1], min(max_new, 16))
    methods = _methods(target, max_new, k, kinds, checkpoints)
    ceiling = f"engine+oracle(k={k})"
    tallies = {name: _Tally(name) for name in [*(name for name, _ in methods), ceiling]}
    base = tallies[TARGET_ONLY]

    def oracle(i: int, ids: list[int]) -> Decoded:
        engine = SpeculativeEngine(target, OracleSpeculator(base.outputs[i]), k)
        return _engine_one(engine, ids, max_new)

    for i, ids in enumerate(prompts):
        for name, decode in methods if i % 2 == 0 else methods[::-1]:
            tallies[name].add(decode(i, ids))
        tallies[ceiling].add(oracle(i, ids))
        on_round(i + 1, _compared(tallies, target, prompts[: i + 1]))
    return _compared(tallies, target, prompts)


def _methods(target: Target, max_new: int, k: int, kinds: list[str],
             checkpoints: dict[str, Path]) -> list[Method]:
    """The engine alone (the baseline), Hugging Face generate with and without prompt
    lookup, and the engine with each kind (a checkpoint's where given)."""
    from autospec.speculators import registry
    from autospec.speculators.checkpoint import load_speculator
    from autospec.speculators.registry import new_speculator

    def engine(spec=None, kk: int = k):  # type: ignore[no-untyped-def]
        e = SpeculativeEngine(target, spec, kk)
        return lambda i, ids: _engine_one(e, ids, max_new)

    def hf(lookup: int):  # type: ignore[no-untyped-def]
        def decode(i: int, ids: list[int]) -> Decoded:
            new, seconds = _hf_one(target, ids, max_new, lookup)
            return new, len(new), seconds, None, 0
        return decode

    methods: list[Method] = [(TARGET_ONLY, engine()), (_hf_name(0), hf(0)),
                             (_hf_name(k), hf(k))]
    for kind in kinds:
        if kind in checkpoints:
            spec, label = load_speculator(checkpoints[kind], target), f"engine+{kind}(ckpt)"
        else:
            spec, label = new_speculator(kind, target), f"engine+{kind}(untrained)"
        if not registry.kind(kind).trainable:  # nothing to train: not "untrained"
            label = f"engine+{kind}"
        methods.append((f"{label}(k={k})", engine(spec)))
    return methods


def _compared(tallies: dict[str, _Tally], target: Target, prompts: list[list[int]]) -> list[Run]:
    """Each method's run over ``prompts``, compared with the engine's target-only run."""
    base = tallies[TARGET_ONLY].run()
    runs = [base if name == TARGET_ONLY else tally.run() for name, tally in tallies.items()]
    for run in runs:
        compare(run, base, target, prompts)
    return runs


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

        prompts = [target.encode_chat(m) for m in BENCH_PROMPTS[:num_prompts]]

        def on_round(done: int, runs: list[Run], section: dict = section,
                     total: int = len(prompts)) -> None:
            section["runs"][:] = [_public(run) for run in runs]  # so far: partial JSON
            section["prompts_done"] = done
            progress.done(f"{section['dtype']} prompt {done}/{total}: decoded by "
                          f"each of {len(runs)} methods")

        with progress.stage(f"{name}: {len(prompts)} prompts × {max_new} tokens, each method "
                            "in turn per prompt (order reversed every other prompt)"):
            runs = build_runs(target, prompts, max_new, k, kinds, checkpoints, on_round)
        for run in runs:
            shown = "" if run.tau is None else f", τ {run.tau:.2f}"
            progress.done(f"{name} {run.name}: {run.tokens_per_s:.1f} tokens/s{shown}, "
                          f"{run.speedup:.2f}× speed, "
                          f"{'lossless' if run.lossless else 'NOT lossless'}")
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

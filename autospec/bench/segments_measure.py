"""The decodes of ``autospec bench segments``: picking the versions, then both arms measured.

:func:`pick_versions` runs the gate's measurement (:func:`autospec.evaluate.speed.measure_speedups`:
interleaved rounds of real greedy decodes, target-only beside each candidate) on each
segment's picking prompts and picks by its decoded median of per-round ratios, not by the
projection the gate ranks on (replayed τ over step cost: the picking prompts are the ones
decoded here, so the decodes are what the pick should see). :func:`measure_arms` decodes every
evaluation request with the target alone, with the global version (arm ``global``) and
with its segment's version (arm ``segment``), back to back in one round
(:func:`autospec.evaluate.speed.interleaved`: the order reversed every other round), the
rounds alternating between segments so that a change of load weighs on every segment
alike. Each round's measured figures are kept (``rounds``); every total, τ and ratio is
computed from them. Knows nothing of training or of the store.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from autospec.bench.progress import BenchProgress
from autospec.engine.clock import clock
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.engine.stats import tau
from autospec.engine.target import Target
from autospec.evaluate.speed import TARGET_ONLY, Decoded, interleaved, measure_speedups

GLOBAL = "global"  # the group trained on the mix, and the arm that serves its pick
SEGMENT = "segment"  # the arm that serves each request's segment version
ARMS = (TARGET_ONLY, GLOBAL, SEGMENT)


def pick_versions(target: Target, specs: Mapping, select: Mapping[str, list[list[int]]], *,
                  k: int, max_tokens: int, progress: BenchProgress) -> dict:
    """The global version (best global candidate over every segment's prompts) and each
    segment's (best of the global candidates and its own on its prompts), by decoded
    speedup; each candidate's measured speedup beside them. Ties go to the global one."""
    mixed = [v for v in specs if v.startswith(f"{GLOBAL}/")]
    ratios: dict[str, list[float]] = {v: [] for v in mixed}
    segments = {}
    for segment, prompts in select.items():
        pool = mixed + [v for v in specs if v.startswith(f"{segment}/")]
        with progress.stage(f"picking {segment}'s version: {len(pool)} candidates on "
                            f"{len(prompts)} held-out prompts"):
            m = measure_speedups(target, {v: specs[v] for v in pool}, prompts, k=k,
                                 max_tokens=max_tokens, repeats=1)
        for v in mixed:
            ratios[v] += m.ratios[v]
        pick = max(pool, key=lambda v: m.speedup[v])
        segments[segment] = {"version": pick, "prompts": len(prompts), "speedup": m.speedup,
                             "tokens_per_s": m.tokens_per_s,
                             "decode_tokens_per_s": m.decode_tokens_per_s}
        progress.done(f"{segment}: picked {pick} (" + ", ".join(
            f"{v} {m.speedup[v]:.2f}×" for v in pool) + ")")
    speedup = {v: statistics.median(r) for v, r in ratios.items()}
    pick = max(mixed, key=lambda v: speedup[v])
    progress.done(f"global: picked {pick} (" + ", ".join(
        f"{v} {s:.2f}×" for v, s in speedup.items()) + " over every segment)")
    return {GLOBAL: {"version": pick, "speedup": speedup}, "segments": segments}


def _version(arm: str, segment: str, picks: dict) -> str:
    if arm == GLOBAL:
        return picks[GLOBAL]["version"]
    return picks["segments"][segment]["version"] if arm == SEGMENT else TARGET_ONLY


def _rounds(evals: Mapping[str, list[list[int]]], limit: int) -> list[tuple[str, list[int]]]:
    """(segment, prompt) per round, segments alternating; prompts cut to fit ``limit``."""
    longest = max(len(p) for p in evals.values())
    return [(s, evals[s][i][-limit:]) for i in range(longest) for s in evals
            if i < len(evals[s])]


def measure_arms(target: Target, specs: Mapping, picks: dict,
                 evals: Mapping[str, list[list[int]]], *, k: int, max_tokens: int,
                 progress: BenchProgress) -> dict:
    """Every evaluation request decoded by the target alone and by both arms (module doc):
    each round's figures, and per segment and overall τ, tokens/s, speedup, ratio."""
    params = SamplingParams(max_new_tokens=max_tokens)
    rounds = _rounds(evals, target.info.max_position_embeddings - max_tokens - k - 1)
    used = {_version(a, s, picks) for s, _ in rounds for a in ARMS} - {TARGET_ONLY}
    engines = {TARGET_ONLY: SpeculativeEngine(target)}
    engines |= {v: SpeculativeEngine(target, specs[v], k) for v in sorted(used)}
    for engine in engines.values():  # warm-up, untimed
        engine.generate(rounds[0][1], SamplingParams(max_new_tokens=min(8, max_tokens)))
    records = [{"segment": s, "prompt_tokens": len(p), "version": {}, "tokens": {},
                "seconds": {}, "ttft": {}, "steps": {}, "accepted": {}, "output": {}}
               for s, p in rounds]

    def decode(r: int, arm: str) -> Decoded:
        segment, prompt = rounds[r]
        rec, version = records[r], _version(arm, segment, picks)
        started = clock(target.device)
        result = engines[version].generate(prompt, params)
        seconds = clock(target.device) - started
        stats = result.stats
        rec["version"][arm], rec["tokens"][arm], rec["seconds"][arm] = (
            version, stats.output_tokens, seconds)
        rec["ttft"][arm] = stats.ttft_s
        rec["steps"][arm], rec["accepted"][arm] = stats.num_drafts, stats.num_accepted_tokens
        rec["output"][arm] = result.token_ids
        return Decoded(stats.output_tokens / seconds if seconds > 0 else 0.0, stats.tau)

    def tick(done: int, total: int) -> None:
        progress.done(f"{records[done - 1]['segment']} request decoded by every arm "
                      f"({done}/{total})")

    with progress.stage(f"decoding {len(rounds)} held-out requests: target-only, the global "
                        f"version, the segment versions"):
        interleaved(list(ARMS), len(rounds), decode, tick)
    for rec in records:
        outputs = rec.pop("output")
        rec["identical"] = {a: outputs[a] == outputs[TARGET_ONLY] for a in (GLOBAL, SEGMENT)}
    return {"rounds": records,
            "segments": {s: figures([r for r in records if r["segment"] == s]) for s in evals},
            "overall": figures(records)}


def decode_seconds(rec: dict, arm: str) -> float:
    """A round's seconds after the first token for ``arm`` (latency − TTFT, as logged)."""
    return rec["seconds"][arm] - rec["ttft"][arm]


def figures(records: list[dict]) -> dict:
    """τ, tokens/s, speedup over target-only and identical outputs of each arm over
    ``records`` (rounds), and the segment arm's tokens/s over the global arm's: over whole
    decodes (what a client waits for) and after the first token (``decode_``: prefill left
    out, as the gate's rounds compare)."""
    arms = {}
    for arm in ARMS:
        tokens = sum(r["tokens"][arm] for r in records)
        seconds = sum(r["seconds"][arm] for r in records)
        after = sum(decode_seconds(r, arm) for r in records)
        arms[arm] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                     "decode_tokens_per_s": (tokens - len(records)) / after if after > 0
                     else None,
                     "tau": tau(sum(r["accepted"][arm] for r in records),
                                sum(r["steps"][arm] for r in records)),
                     "versions": sorted({r["version"][arm] for r in records})}
    for arm in (GLOBAL, SEGMENT):
        arms[arm]["speedup"] = arms[arm]["tokens_per_s"] / arms[TARGET_ONLY]["tokens_per_s"]
        arms[arm]["decode_speedup"] = _ratio(arms[arm], arms[TARGET_ONLY])
        arms[arm]["identical"] = sum(r["identical"][arm] for r in records)
    return {"requests": len(records), "arms": arms,
            "segment_over_global": arms[SEGMENT]["tokens_per_s"] / arms[GLOBAL]["tokens_per_s"],
            "segment_over_global_decode": _ratio(arms[SEGMENT], arms[GLOBAL])}


def _ratio(a: dict, b: dict) -> float | None:
    """``a``'s rate after the first token over ``b``'s (None where either is unknown)."""
    x, y = a["decode_tokens_per_s"], b["decode_tokens_per_s"]
    return x / y if x and y else None

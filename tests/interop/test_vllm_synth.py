"""``autospec synth --engine vllm`` on the real default target: vLLM answers the prompts.

Float32 and greedy, so vLLM's answers must equal the native batch's token for token (EOS
included where it ended an answer); the rows carry the run's engine-independent marks. One
vLLM engine start (~1-2 min on 2 CPU cores).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")


def test_vllm_answers_domain_prompts_as_the_native_batch_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autospec import store
    from autospec.engine.sampling import SamplingParams
    from autospec.engine.target import load_target
    from autospec.synth.backends import NativeSampler
    from autospec.synth.run import SynthRequest, synthesize

    target = load_target("smollm2-135m", dtype="float32")
    engine = store.open_store(f"sqlite:///{tmp_path / 'synth.db'}", upgrade=True)
    request = SynthRequest(sources=("domain:support", "domain:json"), count=3, temperature=0.0,
                           max_new_tokens=24, batch_size=3, heldout_fraction=0.0, seed=3,
                           engine="vllm")
    outcome = synthesize(request, engine=engine, target=target)
    assert outcome.engine == "vllm" and outcome.written == 6
    ident = store.SyntheticTarget(target.info.target_id, target.info.revision, "float32")
    with store.session_scope(engine, readonly=True) as session:
        rows = store.select_synthetic(session, target=ident, split="train")
    assert {r.source for r in rows} == {"domain:support", "domain:json"}
    native = NativeSampler(target).answer([r.prompt_ids for r in rows],
                                          SamplingParams(max_new_tokens=24, temperature=0.0), 0)
    assert [r.output_ids for r in rows] == native
    engine.dispose()

"""``autospec synth --engine vllm`` on the real default target: vLLM answers the prompts.

Float32 and greedy, so vLLM's answers must equal the native batch's token for token (EOS
included where it ended an answer); the rows carry the run's engine-independent marks. One
vLLM engine start, eager (``--vllm-option enforce_eager=true``: the default compiles the
model with inductor first, ~2 more minutes on 2 CPU cores; tests/serve/test_vllm_prefix_reset.py
runs that path on a tiny target). The command runs in its own process, as a user
runs it: an in-process vLLM engine leaves torch state behind (compiled graphs, dispatch
and grad modes) that other tests of this process must not inherit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")


def test_vllm_answers_domain_prompts_as_the_native_batch_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autospec import store
    from autospec.engine.sampling import SamplingParams
    from autospec.engine.target import load_target
    from autospec.synth.backends import NativeSampler

    target = load_target("smollm2-135m", dtype="float32")
    cli = Path(sys.executable).with_name("autospec")
    # synth creates no SQLite file a URL names (a mistyped path stays a mistake)
    store.open_store(f"sqlite:///{tmp_path / 'synth.db'}", upgrade=True).dispose()
    done = subprocess.run(
        [str(cli), "synth", "--source", "domain:support", "--source", "domain:json",
         "--count", "3", "--temperature", "0", "--max-tokens", "24", "--batch-size", "3",
         "--heldout-fraction", "0", "--seed", "3", "--engine", "vllm", "--target",
         "smollm2-135m", "--dtype", "float32", "--vllm-option", "enforce_eager=true",
         "--url", f"sqlite:///{tmp_path / 'synth.db'}",
         "--json"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout)  # --json: stdout holds the one object, vLLM logs none
    assert outcome["engine"] == "vllm" and outcome["written"] == 6, outcome
    engine = store.open_store(f"sqlite:///{tmp_path / 'synth.db'}")
    ident = store.SyntheticTarget(target.info.target_id, target.info.revision, "float32")
    with store.session_scope(engine, readonly=True) as session:
        rows = store.select_synthetic(session, target=ident, split="train")
    assert {r.source for r in rows} == {"domain:support", "domain:json"}
    native = NativeSampler(target).answer([r.prompt_ids for r in rows],
                                          SamplingParams(max_new_tokens=24, temperature=0.0), 0)
    assert [r.output_ids for r in rows] == native
    engine.dispose()

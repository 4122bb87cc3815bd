"""``autospec synth --engine vllm`` loads vLLM in its own process: the per-weight dtype
warnings of a float32 target served in bfloat16 are counted there and summed up in one line,
as a replica's engine does (vLLM itself stands in for a fake here that logs the loader's
warnings as vLLM 0.32 does; the real load is pinned by
tests/serve/test_vllm_weight_casts_tiny.py)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from autospec.engine.vllm.weight_casts import CAST_MESSAGE, VLLM_LOGGER


def test_a_bfloat16_synth_engine_logs_one_cast_line_not_one_per_weight_tiny(
        tiny, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    from autospec.synth import backends

    class FakeLLM:  # logs as vLLM's AutoWeightsLoader does for each weight it casts
        def __init__(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
            loader = logging.getLogger(VLLM_LOGGER)
            for name in ("layers.0.mlp.down_proj.weight", "norm.weight"):
                loader.warning(CAST_MESSAGE, name, "torch.float32", "torch.bfloat16")

    for name in ("VLLM_CONFIGURE_LOGGING", "VLLM_ENABLE_V1_MULTIPROCESSING"):  # undone after
        monkeypatch.setenv(name, "0")  # (the sampler sets them for the process it runs in)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr("autospec.interop.export.target_dir", lambda target: "/nowhere")
    with caplog.at_level(logging.INFO):
        backends.VllmSampler(tiny, max_model_len=64)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if m.startswith("Attempted to load weight")], messages
    assert any("2 weights cast from float32 to bfloat16 at load" in m for m in messages)


@pytest.fixture(autouse=True)
def _no_filter_left_behind():  # type: ignore[no-untyped-def]
    logger = logging.getLogger(VLLM_LOGGER)
    before = list(logger.filters)
    yield
    logger.filters[:] = before

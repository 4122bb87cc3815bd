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
        tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
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
    # handlers on the two loggers themselves: what passes the loader logger's filter, and
    # autospec's line, whatever levels and propagation earlier tests (vLLM's own logging
    # set-up, a CLI's) left on them
    loader, summary = _Records(), _Records()
    for logger, handler in ((logging.getLogger(VLLM_LOGGER), loader),
                            (logging.getLogger(backends.__name__), summary)):
        monkeypatch.setattr(logger, "level", logging.INFO)
        monkeypatch.setattr(logger, "disabled", False)  # a dictConfig's disable_existing
        logger.addHandler(handler)
    try:
        backends.VllmSampler(tiny, max_model_len=64)
    finally:
        for logger, handler in ((logging.getLogger(VLLM_LOGGER), loader),
                                (logging.getLogger(backends.__name__), summary)):
            logger.removeHandler(handler)
    assert loader.messages == []  # each per-weight warning dropped
    assert len(summary.messages) == 1, summary.messages
    assert "2 weights cast from float32 to bfloat16 at load" in summary.messages[0]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def _no_filter_left_behind():  # type: ignore[no-untyped-def]
    logger = logging.getLogger(VLLM_LOGGER)
    before = list(logger.filters)
    yield
    logger.filters[:] = before


@pytest.mark.parametrize(("options", "kv_bytes"), [
    ({}, 1 << 30), ({"enforce_eager": True, "max_num_seqs": 4}, 1 << 30),
    ({"kv_cache_memory_bytes": 1 << 28}, 1 << 28), ({"gpu_memory_utilization": 0.5}, None),
])
def test_the_synth_engine_gets_the_vllm_options_tiny(tiny, monkeypatch, options,
                                                     kv_bytes) -> None:  # type: ignore[no-untyped-def]
    """``--vllm-option`` reaches vLLM's engine beside what synthesis sets; either KV cache
    sizing replaces autospec's CPU default (1 GiB), as on ``autospec serve``."""
    from autospec.synth import backends

    given: dict = {}

    class FakeLLM:
        def __init__(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
            given.update(kwargs)

    for name in ("VLLM_CONFIGURE_LOGGING", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr("autospec.interop.export.target_dir", lambda target: "/nowhere")
    backends.VllmSampler(tiny, max_model_len=64, options=options)
    assert {k: v for k, v in given.items() if k in options} == options
    assert given["model"] == "/nowhere" and given["max_model_len"] == 64 and given["seed"] == 0
    assert given.get("kv_cache_memory_bytes") == kv_bytes
    assert given["enable_prefix_caching"] is True

"""The filter on vLLM's loader logger (:mod:`autospec.engine.vllm.weight_casts`), through real
loggers without vLLM: it drops and counts only the per-weight warnings of casts that round
into bfloat16, lets every other record through, counts each load once; the summary line
takes the largest count of a tensor-parallel engine's workers. The engine itself:
tests/serve/test_vllm_weight_casts_tiny.py."""

from __future__ import annotations

import logging

import pytest
import torch

from autospec.engine.vllm.weight_casts import (
    CAST_MESSAGE,
    VLLM_LOGGER,
    WeightCastFilter,
    cast_summary,
    install_cast_filter,
)


@pytest.fixture
def casts():  # type: ignore[no-untyped-def]
    logger = logging.getLogger(VLLM_LOGGER)
    before = list(logger.filters)
    yield install_cast_filter()
    logger.filters[:] = before


def _warn(weight: torch.dtype, param: torch.dtype, name: str = "layers.0.o_proj.weight") -> None:
    logging.getLogger(VLLM_LOGGER).warning(CAST_MESSAGE, name, weight, param)


def test_rounding_casts_are_counted_not_logged_and_others_still_warn(casts, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=VLLM_LOGGER)
    assert install_cast_filter() is casts  # one per process
    assert sum(isinstance(f, WeightCastFilter)
               for f in logging.getLogger(VLLM_LOGGER).filters) == 1
    for _ in range(3):
        _warn(torch.float32, torch.bfloat16)
    _warn(torch.float16, torch.bfloat16)
    _warn(torch.float32, torch.float16)  # may overflow: vLLM's warning stays
    _warn(torch.bfloat16, torch.int8)
    logging.getLogger(VLLM_LOGGER).warning("Attempted to load nested weight %s", "x")
    kept = [r.getMessage() for r in caplog.records]
    assert kept == [
        "Attempted to load weight layers.0.o_proj.weight with dtype torch.float32 into "
        "parameter with dtype torch.float16",
        "Attempted to load weight layers.0.o_proj.weight with dtype torch.bfloat16 into "
        "parameter with dtype torch.int8",
        "Attempted to load nested weight x"]
    assert casts.take() == {"float32->bfloat16": 3, "float16->bfloat16": 1}
    assert casts.take() == {}  # each load reported once


def test_the_summary_counts_weights_once_across_workers() -> None:
    assert cast_summary([{}, {}]) is None
    assert cast_summary([]) is None
    line = cast_summary([{"float32->bfloat16": 122}, {"float32->bfloat16": 122},
                         {"float16->bfloat16": 2}])
    assert line == ("2 weights cast from float16 to bfloat16, 122 weights cast from float32 "
                    "to bfloat16 at load (rounded to the serving dtype; vLLM's per-weight "
                    "warnings dropped)")

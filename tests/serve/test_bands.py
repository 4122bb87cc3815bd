"""Concurrency bands: their text and list forms, their checks, the k they give, vLLM's
schedule; the load tracker behind ``sampling.concurrency``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autospec.serve.bands import (
    OPEN_END,
    BandsError,
    drafted_fewer,
    parse_bands,
    vllm_schedule,
)
from autospec.serve.config import ServeConfig
from autospec.serve.load import InFlight


def test_bands_give_k_by_concurrency_in_both_forms() -> None:
    bands = parse_bands("1-2:5, 3-6:3 ,7-:0", max_k=5)
    assert bands is not None and str(bands) == "1-2:5,3-6:3,7-:0"
    assert [bands.k_for(n) for n in (0, 1, 2, 3, 6, 7, 500)] == [5, 5, 5, 3, 3, 0, 0]
    same = parse_bands(bands.as_list(), max_k=5)
    assert same == bands
    assert parse_bands("1:4,2-:2", max_k=5).k_for(1) == 4  # a one-value band
    assert parse_bands(None, max_k=5) is None and parse_bands(" ", max_k=5) is None


@pytest.mark.parametrize(("text", "message"), [
    ("2-:3", "starts at 2, expected 1"),
    ("1-2:5,4-:0", "starts at 4, expected 3"),
    ("1-3:5,2-:0", "starts at 2, expected 4"),
    ("1-2:5", "the last band must be open"),
    ("1-:5,3-:0", "only the last band may be open"),
    ("1-2:9,3-:0", "k must be between 0 and the deployment's k (5)"),
    ("1-2:-1,3-:0", "k must be between 0"),
    ("1-2,3-:0", "write FIRST-LAST:K"),
    ("one-:2", "write FIRST-LAST:K"),
])
def test_unusable_bands_are_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(BandsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_bands(text, max_k=5)


def test_a_list_without_integers_is_refused() -> None:
    with pytest.raises(BandsError, match="integer 'first', 'k'"):
        parse_bands([{"first": 1}], max_k=5)


def test_a_request_a_band_drafted_fewer_tokens_for_is_banded() -> None:
    # native: the request's one k, the band's at its start
    assert drafted_fewer(5, k=0, bands="1-1:5,2-:0", in_flight=2, concurrency=2.0)
    assert drafted_fewer(5, k=3, bands=None, in_flight=1, concurrency=1.0)
    assert not drafted_fewer(5, k=5, bands="1-1:5,2-:0", in_flight=1, concurrency=3.0)
    assert not drafted_fewer(0, k=0, bands=None, in_flight=1, concurrency=1.0)  # target-only
    # vLLM: k per step from the batch size; the most requests it saw in flight decide
    bands = "1-2:5,3-4:3,5-:0"
    assert not drafted_fewer(5, k=None, bands=bands, in_flight=2, concurrency=1.4)
    assert drafted_fewer(5, k=None, bands=bands, in_flight=2, concurrency=2.2)  # up to 3
    assert drafted_fewer(5, k=None, bands=bands, in_flight=3, concurrency=1.0)
    assert not drafted_fewer(5, k=None, bands=None, in_flight=8, concurrency=8.0)
    assert not drafted_fewer(3, k=None, bands="1-4:3,5-:0", in_flight=4, concurrency=4.0)
    # a request's n choices are n rows of vLLM's batch: alone with n=2 it ran at batch 2
    assert not drafted_fewer(5, k=None, bands="1-1:5,2-:0", in_flight=1, concurrency=1.0)
    assert drafted_fewer(5, k=None, bands="1-1:5,2-:0", in_flight=1, concurrency=1.0, n=2)


def test_vllm_gets_its_per_batch_size_schedule() -> None:
    bands = parse_bands("1-2:5,3-:0", max_k=5)
    assert bands is not None
    assert vllm_schedule(bands) == [(1, 2, 5), (3, OPEN_END, 0)]
    dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    lookup = dynamic.build_dynamic_sd_schedule_lookup(vllm_schedule(bands), 8, 5)
    assert lookup[1:] == [5, 5, 0, 0, 0, 0, 0, 0]  # vLLM reads it as the bands say


def test_the_serve_config_checks_bands_against_its_k() -> None:
    assert ServeConfig(target="t", k_bands="1-4:3,5-:0").k_bands == "1-4:3,5-:0"
    with pytest.raises(ValidationError, match="k_bands"):
        ServeConfig(target="t", speculator_k=2, k_bands="1-4:3,5-:0")


def test_in_flight_gives_the_mean_load_over_a_request_life() -> None:
    now = [0.0]
    load = InFlight(clock=lambda: now[0])
    a = load.enter()  # alone for 1 s
    now[0] = 1.0
    b = load.enter()  # then two for 1 s
    now[0] = 2.0
    assert load.mean_since(a) == pytest.approx(1.5)
    load.leave()
    now[0] = 4.0  # b alone for 2 s
    assert load.mean_since(b) == pytest.approx((2 * 1 + 1 * 2) / 3)
    assert load.count == 1
    load.leave()
    load.leave()  # an extra leave never goes below zero
    assert load.count == 0
    c = load.enter()
    assert load.mean_since(c) == 1.0  # no time passed: the count now

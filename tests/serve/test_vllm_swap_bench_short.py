"""The short form of ``autospec bench swap`` (so it cannot rot): a real vLLM engine on the
default target, two suffix indexes swapped in place twice under 2 clients; nothing fails and
each swap reports its load and the first response drafted by the new version. ~1-2 minutes."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")


def test_swaps_in_place_under_load_lose_no_request(tmp_path) -> None:
    from autospec.bench.swap import run_swap_bench

    bench = run_swap_bench(target_name="smollm2-135m", dtype="float32", kind="suffix",
                           swaps=2, clients=2, k=4, max_tokens=16, interval_s=1.0,
                           side_by_side=False, workdir=tmp_path)
    figures = bench.as_dict()
    assert figures["failed"] == 0 and figures["answered"] > 0, figures
    assert len(figures["swaps"]) == 2
    assert all(0 <= s["load_s"] < 30 and 0 <= s["first_named_s"] <= s["first_response_s"]
               for s in figures["swaps"])
    assert figures["rss_peak_mb"] >= figures["rss_before_mb"] > 0


def test_segment_slots_swapped_under_load_lose_no_request(tmp_path) -> None:
    """``--segments``: each swap loads a slot beside the deployment's index and drops the one
    before, while one client's requests name the newest slot and the other's none."""
    from autospec.bench.swap import run_swap_bench

    bench = run_swap_bench(target_name="smollm2-135m", dtype="float32", kind="suffix",
                           swaps=2, clients=2, k=4, max_tokens=16, interval_s=1.0,
                           side_by_side=False, workdir=tmp_path, segments=True)
    figures = bench.as_dict()
    assert figures["failed"] == 0 and figures["answered"] > 0, figures
    assert figures["segments"] is True and len(figures["swaps"]) == 2
    assert all(0 <= s["load_s"] < 30 and 0 <= s["first_named_s"] <= s["first_response_s"]
               for s in figures["swaps"])

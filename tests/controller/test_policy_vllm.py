"""A policy for a vLLM deployment (``training.engine: vllm``): kinds vLLM cannot serve are
refused with a message; eagle3 candidates are trained as what vLLM runs (chains, no index)."""

from __future__ import annotations

import pytest

from autospec.controller.policy import PolicyError, parse_policy


def test_suffix_candidates_are_refused_for_vllm() -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy("training:\n  engine: vllm\n  kinds: [suffix, eagle3]\n", source="p.yaml")
    assert "vLLM cannot serve suffix candidates" in str(err.value) and "p.yaml" in str(err.value)


def test_eagle3_for_vllm_is_trained_as_chains_without_an_index() -> None:
    policy = parse_policy("training:\n  engine: vllm\n  kinds: [eagle3, draft]\n")
    assert policy.training.overrides("eagle3") == {"tree_nodes": 0, "suffix_threshold": None}
    assert policy.training.overrides("draft") == {}
    native = parse_policy("training:\n  kinds: [suffix, eagle3]\n")
    assert native.training.overrides("eagle3") == {}


def test_auto_trains_the_kinds_the_serving_engine_runs_and_skips_the_others() -> None:
    policy = parse_policy("training:\n  kinds: [suffix, eagle3]\n")
    assert policy.training.engine == "auto"
    assert policy.training.kinds_for("native") == (["suffix", "eagle3"], [])
    assert policy.training.kinds_for("vllm") == (["eagle3"], ["suffix"])
    assert policy.training.overrides("eagle3", "vllm") == {"tree_nodes": 0,
                                                           "suffix_threshold": None}
    only_suffix = parse_policy("training:\n  kinds: [suffix]\n")
    with pytest.raises(PolicyError, match="engine vllm, which cannot serve suffix"):
        only_suffix.training.kinds_for("vllm")

"""A policy for a vLLM deployment (``training.engine: vllm``): every trainable kind is
trained (suffix versions run in vLLM as autospec's custom proposer); eagle3 candidates are
trained as what vLLM runs (chains, no index)."""

from __future__ import annotations

from autospec.controller.policy import parse_policy


def test_suffix_candidates_are_trained_for_vllm() -> None:
    policy = parse_policy("training:\n  engine: vllm\n  kinds: [suffix, eagle3]\n")
    assert policy.training.kinds == ["suffix", "eagle3"]
    assert policy.training.overrides("suffix") == {}


def test_eagle3_for_vllm_is_trained_as_chains_without_an_index() -> None:
    policy = parse_policy("training:\n  engine: vllm\n  kinds: [eagle3, draft]\n")
    assert policy.training.overrides("eagle3") == {"tree_nodes": 0, "suffix_threshold": None}
    assert policy.training.overrides("draft") == {}
    native = parse_policy("training:\n  kinds: [suffix, eagle3]\n")
    assert native.training.overrides("eagle3") == {}
    assert native.training.overrides("eagle3", "vllm") == {"tree_nodes": 0,
                                                           "suffix_threshold": None}

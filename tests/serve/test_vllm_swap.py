"""Which versions go into the running vLLM engine (:func:`in_place_refusal`), read from what
autospec exports for vLLM; tiny random-init heads built from the tiny target's config."""

from __future__ import annotations

import pytest

from autospec.engine.vllm.swap import DraftShape, draft_shape, in_place_refusal
from autospec.interop.export import export_speculator
from autospec.speculators.registry import new_speculator


@pytest.fixture(scope="session")
def tiny_llm(tiny_llm_4_layers):  # type: ignore[no-untyped-def]
    """4 layers: eagle3 heads on vLLM need three strictly increasing feature layers up to the
    depth, which the default ones are from 3 layers up."""
    return tiny_llm_4_layers


def _shape(tiny_llm, tmp_path, name, kind="eagle3", k=3, **overrides):  # type: ignore[no-untyped-def]
    spec = new_speculator(kind, tiny_llm, **overrides)
    done = export_speculator(spec, tiny_llm, tmp_path / name, k=k)
    return draft_shape(done.speculative_config, done.out)


def test_heads_of_the_same_architecture_load_in_place_others_start_an_engine(
        tiny_llm, tmp_path) -> None:
    a = _shape(tiny_llm, tmp_path, "a", tree_nodes=0)
    b = _shape(tiny_llm, tmp_path, "b", tree_nodes=0)
    assert a.tensors and in_place_refusal(a, b) is None
    wider = _shape(tiny_llm, tmp_path, "c", tree_nodes=0, intermediate_size=96)
    assert "config differs (transformer_layer_config)" in in_place_refusal(a, wider)
    assert "num_speculative_tokens 3 -> 4" in in_place_refusal(
        a, _shape(tiny_llm, tmp_path, "d", k=4, tree_nodes=0))
    suffix = _shape(tiny_llm, tmp_path, "e", kind="suffix")
    assert "eagle3 -> custom_class (another kind)" in in_place_refusal(a, suffix)
    assert in_place_refusal(suffix, _shape(tiny_llm, tmp_path, "f", kind="suffix")) is None
    ngram = _shape(tiny_llm, tmp_path, "g", kind="ngram")
    assert in_place_refusal(ngram, _shape(tiny_llm, tmp_path, "h", kind="ngram")) is None
    assert "switched on or off" in in_place_refusal(DraftShape(None), ngram)

"""The explicit registry: the kinds' declarations, builders, defaults from a target."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autospec.speculators.config import DraftConfig
from autospec.speculators.draft import DraftSpeculator
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.kind import FitTraining, GradientTraining
from autospec.speculators.ngram import NgramSpeculator
from autospec.speculators.registry import (
    KINDS,
    LISTED,
    UnknownSpeculatorKind,
    build_speculator,
    kind,
    kinds_help,
    new_speculator,
    registered,
    trainable_kinds,
    vllm_overrides,
    vllm_refusal,
)


def test_registry_lists_the_four_kinds() -> None:
    assert sorted(KINDS) == ["draft", "eagle3", "ngram", "suffix"]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_declaration_names_its_own_config_and_speculator(name) -> None:
    entry = kind(name)
    assert entry.name == name and LISTED[name].summary
    assert entry.trainable == LISTED[name].trainable  # the line agrees with the module
    assert entry.config.model_fields["kind"].default == name
    assert entry.speculator.kind == name


def test_how_each_kind_trains_and_serves_on_vllm(tiny) -> None:  # type: ignore[no-untyped-def]
    assert trainable_kinds() == ["suffix", "draft", "eagle3"]
    assert isinstance(kind("suffix").training, FitTraining)
    assert {n: kind(n).training.lr for n in ("draft", "eagle3")} == {"draft": 3e-4,
                                                                      "eagle3": 3e-3}
    assert all(isinstance(kind(n).training, GradientTraining) for n in ("draft", "eagle3"))
    assert kind("ngram").training is None
    assert {n: k.vllm.method for n, k in KINDS.items()} == {
        "ngram": "ngram", "suffix": "custom_class", "draft": "draft_model", "eagle3": "eagle3"}
    assert [n for n, k in KINDS.items() if k.vllm.seeded_with_index] == ["suffix"]
    assert vllm_overrides("eagle3") == {"tree_nodes": 0, "suffix_threshold": None}
    assert vllm_overrides("suffix") == {} and vllm_overrides("mystery") == {}
    assert vllm_refusal("mystery", None, tiny.info) == \
        "a mystery version has no vLLM speculative method"


def test_registered_adds_a_kind_for_the_block_only() -> None:
    toy = replace(kind("ngram"), name="toy")
    with registered(toy, "a toy"):
        assert kind("toy") is toy and "toy" not in trainable_kinds()
        assert "toy (a toy)" in kinds_help()
        with pytest.raises(ValueError, match="already registered"), registered(toy, "again"):
            pass
    assert "toy" not in KINDS and "toy" not in LISTED


def test_a_registry_line_that_disagrees_with_its_module_is_an_error() -> None:
    from autospec.speculators.registry import Listed, _load

    with pytest.raises(RuntimeError, match="does not match its registry line"):
        _load("ngram", Listed("autospec.speculators.ngram", "x", trainable=True))
    with pytest.raises(RuntimeError, match="does not match"):
        _load("suffix", Listed("autospec.speculators.ngram", "x", trainable=False))
    with pytest.raises(RuntimeError, match="vllm_per_request=False"):
        _load("suffix", Listed("autospec.speculators.suffix", "x", trainable=True))
    assert _load("suffix", LISTED["suffix"]).vllm.per_request_versions


def test_the_registry_says_which_kinds_a_vllm_engine_holds_per_segment() -> None:
    """From the registry line, checked against each kind's declaration when it loads."""
    from autospec.speculators.registry import vllm_per_request

    assert [name for name in LISTED if vllm_per_request(name)] == ["suffix"]
    assert all(vllm_per_request(name) == (KINDS[name].vllm is not None
                                          and KINDS[name].vllm.per_request_versions)
               for name in LISTED)
    assert not vllm_per_request(None) and not vllm_per_request("nope")


@pytest.mark.parametrize(
    ("kind", "cls"),
    [("ngram", NgramSpeculator), ("draft", DraftSpeculator), ("eagle3", Eagle3Speculator)],
)
def test_new_speculator_tiny_random_init_builds_each_kind(tiny, kind, cls) -> None:
    spec = new_speculator(kind, tiny)
    assert isinstance(spec, cls) and spec.kind == kind
    assert spec.config.target_id == tiny.info.target_id


def test_new_speculator_takes_heads_from_the_target_and_overrides(tiny) -> None:
    spec = new_speculator("draft", tiny, num_layers=3)
    assert spec.config.num_layers == 3
    assert spec.config.num_heads == tiny.model.config.num_attention_heads
    assert spec.config.intermediate_size == tiny.model.config.intermediate_size


def test_new_speculator_unknown_kind_lists_known_kinds(tiny) -> None:
    with pytest.raises(UnknownSpeculatorKind, match="known kinds: draft, eagle3, ngram"):
        new_speculator("medusa", tiny)


def test_build_speculator_refuses_config_that_does_not_fit_target(tiny) -> None:
    config = DraftConfig.for_target(tiny.info, vocab_size=100)
    with pytest.raises(ValueError, match="vocab_size"):
        build_speculator(config, tiny)


def test_build_speculator_is_deterministic(tiny) -> None:
    a = new_speculator("eagle3", tiny).state_tensors()
    b = new_speculator("eagle3", tiny).state_tensors()
    assert all(bool((a[n] == b[n]).all()) for n in a)


def test_what_kinds_declare_agrees_with_the_code_that_uses_it() -> None:
    """The suffix kind's vLLM proposer is the class vLLM loads; eagle3's bench variants are
    the ones ``autospec bench train`` measures."""
    from autospec.bench.train_variants import VARIANTS
    from autospec.interop import vllm_proposer
    from autospec.speculators import suffix

    assert suffix.VLLM_PROPOSER == vllm_proposer.CLASS_PATH
    assert suffix.VLLM_INDEX_ENV == vllm_proposer.INDEX_ENV
    assert hasattr(vllm_proposer, suffix.VLLM_PROPOSER.rsplit(".", 1)[1])
    assert kind("eagle3").bench_variants == tuple(VARIANTS)

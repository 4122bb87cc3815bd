"""The explicit registry: kinds, builders, defaults from a target."""

from __future__ import annotations

import pytest

from autospec.speculators.config import DraftConfig
from autospec.speculators.draft import DraftSpeculator
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.ngram import NgramSpeculator
from autospec.speculators.registry import (
    SPECULATOR_KINDS,
    UnknownSpeculatorKind,
    build_speculator,
    new_speculator,
)


def test_registry_lists_the_four_kinds() -> None:
    assert sorted(SPECULATOR_KINDS) == ["draft", "eagle3", "ngram", "suffix"]


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

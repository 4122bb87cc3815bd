"""`autospec train --set key=value`: validated by the kind's config model, errors name it."""

from __future__ import annotations

import pytest

from autospec.train.errors import TrainingInputError
from autospec.train.overrides import parse_overrides, settable_fields


def test_values_are_parsed_and_validated_by_the_config() -> None:
    got = parse_overrides("eagle3", ["tree_nodes=8", "suffix_threshold=null",
                                     "tree-min-prob=0", "feature_layers=[1, 2, 3]"])
    assert got == {"tree_nodes": 8, "suffix_threshold": None, "tree_min_prob": 0.0,
                   "feature_layers": (1, 2, 3)}
    assert parse_overrides("draft", ["num_layers=3"]) == {"num_layers": 3}
    assert parse_overrides("suffix", []) == {}


@pytest.mark.parametrize(("kind", "assignment", "words"), [
    ("eagle3", "tree_nodes=65", "tree_nodes=65: Input should be less than or equal to 64"),
    ("eagle3", "tree_width=wide", "tree_width=wide: Input should be a valid integer"),
    ("eagle3", "tree_nodes", "expected key=value"),
    ("draft", "tree_nodes=8", "not a setting of draft; its settings: "),
    ("eagle3", "target_id=other", "not a setting of eagle3"),
    ("eagle3", "suffix_tokens=5", "not a setting of eagle3"),
    ("suffix", "max_match=[", "not a valid value"),
])
def test_a_bad_key_or_value_is_named(kind: str, assignment: str, words: str) -> None:
    with pytest.raises(TrainingInputError, match=words.replace("[", r"\[")):
        parse_overrides(kind, [assignment])


def test_a_bad_key_lists_the_kinds_fields() -> None:
    with pytest.raises(TrainingInputError) as info:
        parse_overrides("eagle3", ["treenodes=1"])
    assert all(name in str(info.value) for name in settable_fields("eagle3"))
    assert "tree_nodes" in settable_fields("eagle3") and "kind" not in settable_fields("eagle3")

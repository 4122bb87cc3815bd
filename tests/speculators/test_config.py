"""Config validation: strict fields, parsing by the kind tag, defaults derived from a target."""

from __future__ import annotations

import pydantic
import pytest

from autospec.speculators.config import (
    DraftConfig,
    Eagle3Config,
    NgramConfig,
    default_feature_layers,
)
from autospec.speculators.registry import parse_config

IDS = {"target_id": "t", "target_revision": "r"}


def test_ngram_min_above_max_names_the_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="min_ngram"):
        NgramConfig(min_ngram=4, max_ngram=3, **IDS)


def test_unknown_field_is_an_error_naming_it() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_ngrams"):
        NgramConfig(max_ngrams=3, **IDS)


def test_missing_target_id_is_an_error_naming_it() -> None:
    with pytest.raises(pydantic.ValidationError, match="target_id"):
        NgramConfig(target_revision="r")


def test_heads_must_divide_hidden_size(tiny) -> None:
    with pytest.raises(pydantic.ValidationError, match="num_heads"):
        DraftConfig.for_target(tiny.info, num_heads=5, num_kv_heads=1)


def test_eagle3_draft_vocab_larger_than_target_is_refused(tiny) -> None:
    with pytest.raises(pydantic.ValidationError, match="draft_vocab_size"):
        Eagle3Config.for_target(tiny.info, draft_vocab_size=65)


def test_eagle3_defaults_follow_the_tiny_random_init_target(tiny) -> None:
    cfg = Eagle3Config.for_target(tiny.info)
    assert cfg.hidden_size == 32
    assert cfg.target_vocab_size == 64
    assert cfg.draft_vocab_size == 64  # min(8192, vocab)
    assert cfg.feature_layers == (1, 2, 3)
    assert (cfg.target_id, cfg.target_revision) == (tiny.info.target_id, tiny.info.revision)


def test_default_feature_layers_like_eagle3() -> None:
    assert default_feature_layers(30) == (2, 15, 27)
    assert default_feature_layers(32) == (2, 16, 29)
    assert default_feature_layers(4) == (1, 2, 3)
    assert default_feature_layers(1) == (1, 1, 1)


def test_default_feature_layers_are_strictly_increasing_below_the_depth() -> None:
    """What vLLM reads as autospec does (it sorts and de-duplicates them); a target of 1 or
    2 layers has no three such ids."""
    for depth in range(3, 100):
        low, mid, high = default_feature_layers(depth)
        assert 0 <= low < mid < high < depth, depth
    assert default_feature_layers(3) == (0, 1, 2)
    assert default_feature_layers(6) == (1, 3, 5)  # was (2, 3, 3)
    assert default_feature_layers(2) == (1, 1, 1)


@pytest.mark.parametrize("cls", [NgramConfig, DraftConfig, Eagle3Config])
def test_parse_config_round_trips_each_kind(tiny, cls) -> None:
    cfg = cls.for_target(tiny.info)
    assert parse_config(cfg.model_dump(mode="json")) == cfg


def test_parse_config_unknown_kind_lists_known_kinds() -> None:
    with pytest.raises(ValueError, match="draft, eagle3, ngram"):
        parse_config({"kind": "medusa", **IDS})


def test_parse_config_wrong_field_for_kind_names_it(tiny) -> None:
    data = NgramConfig.for_target(tiny.info).model_dump(mode="json")
    data["draft_vocab_size"] = 10
    with pytest.raises(pydantic.ValidationError, match="draft_vocab_size"):
        parse_config(data)


def test_parse_config_without_a_kind_lists_known_kinds() -> None:
    with pytest.raises(ValueError, match=r"None.*known kinds: draft, eagle3, ngram, suffix"):
        parse_config(dict(IDS))

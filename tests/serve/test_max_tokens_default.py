"""A Serve config whose ``default_max_tokens`` exceeds ``max_tokens_limit`` is refused when
read: every chat that omits ``max_tokens`` would have got a 400 naming a field it never
sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autospec.serve.config import ServeConfig


def test_a_default_above_the_limit_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"default_max_tokens \(256\) must not exceed "
                                              r"max_tokens_limit \(100\)"):
        ServeConfig(max_tokens_limit=100)
    assert ServeConfig(max_tokens_limit=100, default_max_tokens=100).default_max_tokens == 100

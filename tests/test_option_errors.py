"""Validation errors in a command line's words (autospec/option_errors.py)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError, model_validator

from autospec.option_errors import first_error, option_errors


class _Options(BaseModel):
    max_tokens: int = Field(1, ge=1)
    rules: list[int] = Field(default_factory=list)
    api_key: str = ""

    @model_validator(mode="after")
    def _whole(self) -> _Options:
        if self.max_tokens == 7:
            raise ValueError("seven is refused")
        return self


def _error(**fields) -> ValidationError:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        _Options(**fields)
    return caught.value


def test_each_error_follows_its_option_and_nested_ones_their_path() -> None:
    exc = _error(max_tokens=0, rules=[1, "x"], api_key="sk-hidden")
    lines = option_errors(exc, {"rules": "rule_file"}).splitlines()
    assert lines[0] == "--max-tokens: Input should be greater than or equal to 1"
    assert lines[1].startswith("--rule-file (rules.1): Input should be a valid integer")
    assert first_error(exc) == lines[0]


def test_a_check_over_the_whole_model_is_its_message_alone() -> None:
    exc = _error(max_tokens=7, api_key="sk-hidden")
    assert option_errors(exc) == "seven is refused"
    assert "sk-hidden" not in option_errors(exc) and "sk-hidden" in str(exc)


class _Strict(BaseModel):
    model_config = {"extra": "forbid"}
    name: str = ""
    nested: _Options | None = None


def test_pydantic_wording_of_a_key_or_a_type_is_put_in_plain_words() -> None:
    """An unknown key and a value that should be text or a mapping (a YAML file's unquoted
    ``yes``) read in words, not "Extra inputs are not permitted" / "Input should be a valid
    string"; the input itself is never shown."""
    with pytest.raises(ValidationError) as caught:
        _Strict.model_validate({"name": True, "nmae": "x", "nested": "sk-hidden"})
    assert option_errors(caught.value).splitlines() == [
        "--name: expected text, not true/false (quote it in YAML)",
        "--nested: expected a mapping of keys to values, not text",
        "--nmae: unknown key (check its spelling)"]

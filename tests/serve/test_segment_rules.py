"""Segment rules of the serve config (:mod:`autospec.serve.segments`): what a rule may say,
which segment a request gets (header first, then the first matching rule, then the route),
and `autospec serve --segment-rules` refusing bad rules before anything starts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from autospec.serve.config import ServeConfig
from autospec.serve.segments import SegmentRule, rule_segment, system_prompt
from tests.text import unwrapped

SYSTEM = "You are a terse SQL assistant."
SYSTEM_SHA = hashlib.sha256(SYSTEM.encode()).hexdigest()


def _rules(*rules: dict) -> list[SegmentRule]:
    """The rules alone (matching is the rules' own; a ServeConfig also checks that a model
    rule names its served model)."""
    return [SegmentRule.model_validate(r) for r in rules]


def _chat(system: str | None, model: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": "hi"}]
    return {"messages": messages, **({"model": model} if model else {})}


@pytest.mark.parametrize(("rule", "names"), [
    ({"segment": "a"}, "matches nothing"),
    ({"segment": "a", "header": "x-team"}, "`header` and `value` go together"),
    ({"segment": "a", "value": "red"}, "`header` and `value` go together"),
    ({"segment": "a", "system_sha256": "abc"}, "8 to 64 hex digits"),
    ({"segment": "a", "system_sha256": "zz" * 8}, "8 to 64 hex digits"),
    ({"segment": "a b", "model": "m"}, "segments.0.segment"),
    ({"segment": "a:b", "model": "m"}, "segments.0.segment"),
    ({"segment": "a", "header": "x-autospec-segment", "value": "b"}, "always wins"),
    ({"segment": "a", "header": "bad header", "value": "b"}, "not an HTTP header name"),
    ({"segment": "a", "model": "m", "modle": "m"}, "modle"),
])
def test_a_bad_rule_is_an_error_naming_what_is_wrong(rule, names):
    with pytest.raises(ValidationError) as caught:
        ServeConfig(model_name="m", segments=[{"segment": "ok", "model": "m"}, rule])
    text = str(caught.value)
    assert "segments.1" in text and names.replace("segments.0", "segments.1") in text


def test_first_matching_rule_wins_and_no_match_is_none():
    rules = _rules({"segment": "red-team", "header": "X-Team", "value": "red"},
                   {"segment": "sql", "system_sha256": SYSTEM_SHA[:12].upper()},
                   {"segment": "coder", "model": "coder-1"},
                   {"segment": "both", "model": "m2", "header": "x-team", "value": "blue"})
    # header names are case-insensitive; the first rule wins over the second
    assert rule_segment(rules, headers={"x-team": "red"}, body=_chat(SYSTEM)) == "red-team"
    assert rule_segment(rules, headers={"X-TEAM": "blue"}, body=_chat(SYSTEM)) == "sql"
    assert rule_segment(rules, headers={}, body=_chat(SYSTEM + " ")) is None
    assert rule_segment(rules, headers={}, body=_chat(None, "coder-1")) == "coder"
    assert rule_segment(rules, headers={}, body={"prompt": "x", "model": "coder-1"}) == "coder"
    # a rule naming several matches needs them all
    assert rule_segment(rules, headers={"x-team": "blue"}, body={"model": "m2"}) == "both"
    assert rule_segment(rules, headers={}, body={"model": "m2"}) is None
    assert rule_segment([], headers={"x-team": "red"}, body={}) is None


def test_the_system_prompt_is_the_first_system_or_developer_message_text():
    parts = {"messages": [{"role": "user", "content": "q"},
                          {"role": "developer", "content": [{"type": "text", "text": "You are "},
                                                            {"type": "text", "text": "terse."}]},
                          {"role": "system", "content": "later"}]}
    assert system_prompt(parts) == "You are terse."
    assert system_prompt({"prompt": "completion"}) is None
    assert system_prompt({"messages": "not a list"}) is None


def test_autospec_serve_refuses_bad_rules_before_starting_anything(tmp_path: Path):
    from autospec.cli import app

    bad = tmp_path / "rules.yaml"
    bad.write_text("segments:\n  - segment: sql\n    system_sha256: nothex!\n")
    result = CliRunner().invoke(app, ["serve", "--segment-rules", str(bad)])
    assert result.exit_code == 2, result.output
    assert "segments.0.system_sha256" in result.output and "hex" in result.output
    bad.write_text("segment: sql\n")
    result = CliRunner().invoke(app, ["serve", "--segment-rules", str(bad)])
    assert result.exit_code == 2 and "expected a list of rules" in result.output
    result = CliRunner().invoke(app, ["serve", "--segment-rules", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and str(tmp_path / "nope.yaml") in unwrapped(result.output)


def test_a_rule_may_match_the_end_user_id():
    rules = _rules({"segment": "acme", "user": "acme-42"},
                   {"segment": "acme-coder", "user": "acme-7", "model": "coder-1"})
    assert rule_segment(rules, headers={}, body={**_chat(None), "user": "acme-42"}) == "acme"
    assert rule_segment(rules, headers={}, body={"prompt": "x", "user": "acme-42"}) == "acme"
    assert rule_segment(rules, headers={}, body={**_chat(None), "user": "acme-43"}) is None
    assert rule_segment(rules, headers={}, body={"user": "acme-7", "model": "coder-1"}) \
        == "acme-coder"
    assert rule_segment(rules, headers={}, body={"user": "acme-7"}) is None
    assert rule_segment(rules, headers={}, body={"user": 42}) is None  # not a string


def test_a_model_rule_must_name_the_model_the_deployment_serves():
    """A replica serves one model name and answers 404 to any other, so a rule naming
    another model could never match: refused when the config is read, naming the rule."""
    with pytest.raises(ValidationError) as caught:
        ServeConfig(segments=[{"segment": "sql", "user": "u1"},
                              {"segment": "coder", "model": "coder-7b"}])
    (error,) = caught.value.errors()
    assert error["loc"] == ("segments",)  # the field's: an option names it (below)
    assert "the rule for segment 'coder' (segments.1) names model 'coder-7b', not the model " \
           "this deployment serves ('smollm2-135m'" in error["msg"]
    ok = ServeConfig(model_name="coder-7b", segments=[{"segment": "coder", "model": "coder-7b"}])
    assert ok.segments[0].model == ok.served_model_name
    assert ServeConfig(segments=[{"segment": "all", "model": "smollm2-135m"}]).segments


def _started(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise AssertionError("serve started")


def _serve(tmp_path: Path, text: str, monkeypatch) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """``autospec serve --segment-rules`` of a file of ``text`` (a refusal: nothing may
    start): its output unwrapped (tests/text.py), the file's path."""
    from autospec.cli import app

    monkeypatch.setattr("autospec.serve.cli.deploy", _started)
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    result = CliRunner().invoke(app, ["serve", "--segment-rules", str(rules)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return unwrapped(result.output), str(rules)


TAKES = ("a rule takes `segment` and one or more of `model`, `user`, `system_sha256` or "
         "`header` with `value`")


@pytest.mark.parametrize(("text", "said"), [
    ("segments: []\n", ": expected a list of rules (or `segments:` and a list), not an empty "
     "one"),
    ("[]\n", ": expected a list of rules (or `segments:` and a list), not an empty one"),
    ("segments:\n", ": expected a list of rules (or `segments:` and a list)"),
    ("- {segment: a, heder: x-team, value: red}\n", f"(segments.0): unknown key `heder`: {TAKES}"),
    ("- {segment: a, regex: 'x.*', match: x}\n",
     f"(segments.0): unknown keys `match`, `regex`: {TAKES}"),
    ("- hello\n", "(segments.0): a rule is a mapping of keys (`segment` and one or more of"),
    ("- {segment: 5, model: [x]}\n", "(segments.0.segment): expected text, not a number "
     "(quote it in YAML)"),
    ("- {segment: a, header: x-team, value: yes}\n",
     "(segments.0.value): expected text, not true/false (quote it in YAML)"),
    ("- {segment: 'a b', user: u}\n", "(segments.0.segment): 'a b' cannot name a segment: "
     "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"),
    # a final newline passed the name's "^...$" (re.match): requests logged under 'json\n'
    ('- {segment: "json\\n", user: u}\n', "(segments.0.segment): 'json\\n' cannot name a "
     "segment: "),
    # the same in a header name: a rule on 'x-team\n' would never match a request
    ('- {segment: a, header: "x-team\\n", value: red}\n', "(segments.0.header): "
     "'x-team\\n' is not an HTTP header name"),
    ("- {segment: other, model: gpt-4o}\n", ": the rule for segment 'other' (segments.0) names "
     "model 'gpt-4o', not the model this deployment serves ('smollm2-135m'"),
])
def test_a_bad_rules_file_is_refused_in_words_naming_the_option_and_file(
        tmp_path: Path, text: str, said: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One shape for every refusal of the file — ``--segment-rules FILE``, the rule's path,
    what is wrong — where an empty list had been taken silently, a misspelt key said
    "Extra inputs are not permitted" without the keys a rule takes, a value of the wrong
    type pydantic's "Input should be a valid string", a bad name its pattern, and a rule
    naming another model left out the option."""
    output, rules = _serve(tmp_path, text, monkeypatch)
    assert unwrapped(f"Invalid value for --segment-rules: {rules}{said}") in output, output
    for pydantic in ("Input should", "Extra inputs", "String should", "pattern '^"):
        assert unwrapped(pydantic) not in output

"""Mixes, schedules and prompt sources: parsing, errors that say where, reproducibility."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from autospec.loadgen.mix import MixError, Schedule, parse_mix, parse_schedule
from autospec.loadgen.source import DomainSource, ReplaySource, SourceError, known_domains

KNOWN = known_domains()


def test_mix_is_normalised_and_a_bare_name_means_all():
    assert parse_mix("support=0.7,coding=0.3", known=KNOWN) == pytest.approx(
        {"support": 0.7, "coding": 0.3})
    assert parse_mix("support=3,coding=1") == pytest.approx({"support": 0.75, "coding": 0.25})
    assert parse_mix("json") == {"json": 1.0}


@pytest.mark.parametrize(("text", "words"), [
    ("support=x", "not a number"), ("support=-1", "negative"), ("", "positive weight"),
    ("support=0", "positive weight"), ("poetry=1", "unknown domain"),
])
def test_bad_mixes_say_why(text, words):
    with pytest.raises(MixError, match=words):
        parse_mix(text, known=KNOWN)


def test_schedule_switches_mix_at_its_step_times():
    plan = parse_schedule("0:support=1;120:coding=1;300:coding=1,json=1", known=KNOWN)
    assert plan.mix_at(0) == {"support": 1.0}
    assert plan.mix_at(119.9) == {"support": 1.0}
    assert plan.mix_at(120) == {"coding": 1.0}
    assert plan.mix_at(1e6) == pytest.approx({"coding": 0.5, "json": 0.5})
    rng = random.Random(0)
    assert {plan.pick(10, rng) for _ in range(50)} == {"support"}
    assert {plan.pick(400, rng) for _ in range(200)} == {"coding", "json"}


def test_schedule_from_yaml(tmp_path: Path):
    path = tmp_path / "shift.yaml"
    path.write_text("- {at: 0, mix: {support: 1}}\n- {at: 60, mix: {coding: 2, json: 2}}\n")
    plan = parse_schedule(str(path), known=KNOWN)
    assert plan.mix_at(61) == pytest.approx({"coding": 0.5, "json": 0.5})
    path.write_text("- {at: 0, mix: {support: 1}, extra: 1}\n")
    with pytest.raises(MixError, match="step 0"):
        parse_schedule(str(path), known=KNOWN)


@pytest.mark.parametrize(("text", "words"), [
    ("5:support=1", "start at 0"), ("0:support=1;0:coding=1", "increasing"),
    ("support=1", "START:MIX"), ("x:support=1", "not a number"),
])
def test_bad_schedules_say_why(text, words):
    with pytest.raises(MixError, match=words):
        parse_schedule(text, known=KNOWN)


def test_constant_schedule():
    assert Schedule.constant({"support": 1.0}).mix_at(1e9) == {"support": 1.0}


def test_domain_source_is_reproducible_and_does_not_repeat_early():
    a, b = DomainSource(seed=3, pool=4), DomainSource(seed=3, pool=4)
    first = [a.next("support").messages for _ in range(10)]  # grows past its first pool
    assert first == [b.next("support").messages for _ in range(10)]
    assert len({json.dumps(m) for m in first}) == 10
    assert DomainSource(seed=4).next("support").messages != first[0]
    assert a.next("extraction").segment == "extraction"  # alias of the json domain
    with pytest.raises(SourceError, match="known"):
        a.next("poetry")


def test_replay_reads_strings_chats_and_prompts_and_cycles(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    lines = ['"plain prompt"',
             json.dumps({"messages": [{"role": "user", "content": "hi"}], "segment": "s1",
                         "max_tokens": 5}),
             "",
             json.dumps({"prompt": "complete me", "temperature": 0.5})]
    path.write_text("\n".join(lines) + "\n")
    source = ReplaySource(path)
    got = [source.next() for _ in range(4)]
    assert got[0].prompt == "plain prompt" and got[0].segment == "replay"
    assert got[1].messages == [{"role": "user", "content": "hi"}] and got[1].segment == "s1"
    assert got[1].overrides == {"max_tokens": 5}
    assert got[2].prompt == "complete me" and got[2].overrides == {"temperature": 0.5}
    assert got[3] == got[0]


@pytest.mark.parametrize(("line", "words"), [
    ("{not json", "r.jsonl:2: not JSON"), ("[1, 2]", "r.jsonl:2: a line is"),
    ('{"messages": []}', "r.jsonl:2: 'messages'"), ('{"prompt": "x", "n": 2}', "unknown"),
    ('{"segment": "a"}', "needs 'messages'"),
])
def test_bad_replay_lines_name_the_line(tmp_path: Path, line, words):
    path = tmp_path / "r.jsonl"
    path.write_text('"ok"\n' + line + "\n")
    with pytest.raises(SourceError, match=words):
        ReplaySource(path)


def test_missing_or_empty_replay(tmp_path: Path):
    with pytest.raises(SourceError, match="does not exist"):
        ReplaySource(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(SourceError, match="no requests"):
        ReplaySource(tmp_path / "e.jsonl")

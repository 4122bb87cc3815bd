"""`autospec bench segments`: the accounting of one short run on a tiny random-init target
with SmolLM2's tokenizer (float32, so speculative outputs equal target-only ones) — the same
requests decoded by both arms, every figure recomputed from the measured rounds, the JSON's
shape — and the checks of its input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from autospec.bench.segments_measure import ARMS, GLOBAL, SEGMENT, TARGET_ONLY
from autospec.bench.segments_request import SegmentsBenchRequest
from autospec.cli import app
from tests.serve.helpers import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def _args(tiny_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["bench", "segments", "--target", str(tiny_dir), "--dtype", "float32",
            "--domains", "json,support", "--requests", "20", "--max-new-tokens", "8",
            "--epochs", "1", "--select-requests", "1", "--eval-requests", "2",
            "--draft-vocab-size", "128", "--threads", "1", "--workdir", str(tmp_path / "w"),
            "--json", str(tmp_path / "segments.json"), "--output", str(tmp_path / "s.md"),
            *extra]


def _recomputed(rounds: list[dict], arm: str) -> float:
    return sum(r["tokens"][arm] for r in rounds) / sum(r["seconds"][arm] for r in rounds)


@pytest.mark.slow
def test_both_arms_decode_the_same_requests_and_ratios_come_from_them_tiny(
        tiny_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, _args(tiny_dir, tmp_path))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "segments.json").read_text())
    assert report["complete"] is True
    picks, measured = report["picks"], report["measured"]
    assert set(report["training"]) == {f"{g}/{k}" for g in (GLOBAL, "json", "support")
                                       for k in ("suffix", "eagle3")}
    assert picks[GLOBAL]["version"].startswith(f"{GLOBAL}/")
    for segment, pick in picks["segments"].items():  # its own candidates or the global ones
        assert pick["version"].split("/")[0] in (GLOBAL, segment)
        assert set(pick["speedup"]) == {f"{g}/{k}" for g in (GLOBAL, segment)
                                        for k in ("suffix", "eagle3")}
    rounds = measured["rounds"]
    assert [r["segment"] for r in rounds] == ["json", "support"] * 2  # alternating
    for r in rounds:  # every request decoded by the target alone and by both arms
        assert set(r["tokens"]) == set(ARMS) and all(n > 0 for n in r["tokens"].values())
        assert r["version"][GLOBAL] == picks[GLOBAL]["version"]
        assert r["version"][SEGMENT] == picks["segments"][r["segment"]]["version"]
        assert r["identical"] == {GLOBAL: True, SEGMENT: True}  # greedy float32
    for name, group in [*measured["segments"].items(), ("mix", measured["overall"])]:
        mine = [r for r in rounds if name in ("mix", r["segment"])]
        assert group["requests"] == len(mine) == (4 if name == "mix" else 2)
        arms = group["arms"]
        for arm in ARMS:
            assert arms[arm]["tokens_per_s"] == pytest.approx(_recomputed(mine, arm))
        for arm in (GLOBAL, SEGMENT):
            assert arms[arm]["speedup"] == pytest.approx(
                _recomputed(mine, arm) / _recomputed(mine, TARGET_ONLY))
        assert arms[TARGET_ONLY]["tau"] == pytest.approx(1.0)
        assert group["segment_over_global"] == pytest.approx(
            _recomputed(mine, SEGMENT) / _recomputed(mine, GLOBAL))
        after = {a: sum(r["tokens"][a] - 1 for r in mine) / sum(spent_in(r, a) for r in mine)
                 for a in ARMS}
        assert arms[SEGMENT]["decode_tokens_per_s"] == pytest.approx(after[SEGMENT])
        assert arms[GLOBAL]["decode_speedup"] == pytest.approx(after[GLOBAL] / after[TARGET_ONLY])
        assert group["segment_over_global_decode"] == pytest.approx(after[SEGMENT] / after[GLOBAL])
    goal = report["goal"]
    worst = min(s["segment_over_global"] for s in measured["segments"].values())
    assert goal["worst_segment_ratio"] == pytest.approx(worst)
    assert goal["reached"] == (measured["overall"]["segment_over_global"] >= 1.10
                               and worst >= 1.0)
    check, rate = report["ledger_check"], statistics.median(
        p["decode_tokens_per_s"] for p in picks["segments"].values())
    spent = {a: sum(r["seconds"][a] - r["ttft"][a] for r in rounds) for a in ARMS}
    tokens = sum(r["tokens"][SEGMENT] - 1 for r in rounds)
    assert check["rate_tokens_per_s"] == pytest.approx(rate)
    assert check["ledger_saved_s"] == pytest.approx(tokens / rate - spent[SEGMENT])
    assert check["replay_saved_s"] == pytest.approx(spent[TARGET_ONLY] - spent[SEGMENT])
    assert "ledger check" in result.output
    held = report["ledger_check_holdout"]  # round 3 of 4 held out: R is its target-only rate
    rest = [r for i, r in enumerate(rounds) if i != 2]
    own = (rounds[2]["tokens"][TARGET_ONLY] - 1) / spent_in(rounds[2], TARGET_ONLY)
    assert held["held_out"] == 1 and held["rate_tokens_per_s"] == pytest.approx(own)
    assert held["replay_saved_s"] == pytest.approx(
        sum(spent_in(r, TARGET_ONLY) - spent_in(r, SEGMENT) for r in rest))
    assert held["ledger_saved_s"] == pytest.approx(
        sum((r["tokens"][SEGMENT] - 1) / own - spent_in(r, SEGMENT) for r in rest))
    assert "R from 1 held-out request" in result.output
    assert "picked" in result.output and "(4/4)" in result.output  # progress lines
    text = (tmp_path / "s.md").read_text()
    assert "| mix | 4 |" in text and "| json | 2 |" in text and "goal (segment" in text


def spent_in(rec: dict, arm: str) -> float:
    return rec["seconds"][arm] - rec["ttft"][arm]


@pytest.mark.slow
def test_a_held_out_set_too_small_is_refused_by_name_tiny(tiny_dir: Path,
                                                          tmp_path: Path) -> None:
    result = CliRunner().invoke(app, _args(tiny_dir, tmp_path, "--eval-requests", "9"))
    assert result.exit_code == 2
    assert "json: 4 held-out requests, 10 wanted" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--domains", "json,legal", "unknown domain 'legal'"),
    ("--domains", "json", "give 2 to 3 distinct domains"),
    ("--kinds", "ngram", "trainable kinds"),
])
def test_bad_input_names_the_option_before_anything_loads(option: str, value: str,
                                                          message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "segments", "--target", "nowhere",
                                      option, value], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert message in result.output and f"{option}:" in result.output


def test_every_field_has_its_option_and_every_option_its_field() -> None:
    group = typer.main.get_command(app)
    command = group.commands["bench"].commands["segments"]  # type: ignore[attr-defined]
    options = {p.name: p for p in command.params if p.param_type_name == "option"}
    assert set(options) == set(SegmentsBenchRequest.model_fields)
    for name, field in SegmentsBenchRequest.model_fields.items():
        default = field.default
        assert options[name].default == (",".join(default) if isinstance(default, tuple)
                                          else default), name
        assert options[name].help == field.description, name


def test_figures_sum_tokens_and_seconds_over_the_rounds() -> None:
    from autospec.bench.segments_measure import figures

    def rnd(tokens: dict[str, int], seconds: dict[str, float], steps: dict[str, int],
            accepted: dict[str, int]) -> dict:
        return {"segment": "json", "tokens": tokens, "seconds": seconds, "steps": steps,
                "accepted": accepted, "ttft": dict.fromkeys(ARMS, 0.1),
                "identical": {GLOBAL: True, SEGMENT: False},
                "version": {TARGET_ONLY: TARGET_ONLY, GLOBAL: "global/suffix",
                            SEGMENT: "json/eagle3"}}

    rounds = [rnd({TARGET_ONLY: 10, GLOBAL: 10, SEGMENT: 10}, {TARGET_ONLY: 1.0, GLOBAL: 0.5,
                                                                SEGMENT: 0.25},
                  {TARGET_ONLY: 10, GLOBAL: 4, SEGMENT: 2}, {TARGET_ONLY: 0, GLOBAL: 6,
                                                             SEGMENT: 8}),
              rnd({TARGET_ONLY: 30, GLOBAL: 30, SEGMENT: 30}, {TARGET_ONLY: 3.0, GLOBAL: 1.5,
                                                                SEGMENT: 1.75},
                  {TARGET_ONLY: 30, GLOBAL: 10, SEGMENT: 10}, {TARGET_ONLY: 0, GLOBAL: 20,
                                                               SEGMENT: 20})]
    out = figures(rounds)
    arms = out["arms"]
    assert out["requests"] == 2
    assert arms[TARGET_ONLY]["tokens_per_s"] == pytest.approx(10.0)  # 40 tokens in 4 s
    assert arms[GLOBAL]["tokens_per_s"] == pytest.approx(20.0)  # 40 in 2 s, not a mean of rates
    assert arms[SEGMENT]["speedup"] == pytest.approx(2.0)
    assert out["segment_over_global"] == pytest.approx(1.0)
    # after the first token (0.1 s each): target-only 38 tokens in 3.8 s, global 38 in 1.8 s
    assert arms[TARGET_ONLY]["decode_tokens_per_s"] == pytest.approx(10.0)
    assert arms[GLOBAL]["decode_speedup"] == pytest.approx(38 / 1.8 / 10.0)  # above 2.0
    assert out["segment_over_global_decode"] == pytest.approx(1.0)
    assert arms[GLOBAL]["tau"] == pytest.approx((26 + 14) / 14)
    assert arms[TARGET_ONLY]["tau"] == pytest.approx(1.0)
    assert (arms[GLOBAL]["identical"], arms[SEGMENT]["identical"]) == (2, 0)
    assert arms[SEGMENT]["versions"] == ["json/eagle3"]


def test_the_verdict_names_segments_whose_arms_ran_the_same_version() -> None:
    """Read from a real run's JSON (2026-12-05): json and coding kept the global version."""
    from autospec.bench.segments_print import same_version_segments, verdict

    root = Path(__file__).resolve().parents[2]
    report = json.loads((root / "docs" / "bench" / "segments-2026-12-05.json").read_text())
    assert same_version_segments(report) == ["json", "coding"]
    line = verdict(report)
    assert line.startswith("goal (") and "NOT reached" in line
    assert line.endswith("json, coding: the same version in both arms, so the ratio there is the "
                          "bench's noise")

"""``scripts/step_cost_check.py`` (how well a step's pricing carries from the prompts the
gate decodes to other prompts) on a tiny random-init target, native engine: a short form,
so the script cannot rot."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from autospec.evaluate.speed import MIN_STEP_COST

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "step_cost_check.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("step_cost_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_each_domain_predicts_the_other_both_ways_tiny_random_init(tiny) -> None:  # type: ignore[no-untyped-def]
    script = _script()
    # two "domains": one that repeats itself (the index matches it), one that does not
    prompts = {"repeats": [[1, 2, 3, 4, 5, 6, 7, 8] * 2 for _ in range(4)],
               "varied": [[(7 * i + j) % 60 + 1 for j in range(12)] for i in range(4)]}
    args = argparse.Namespace(train=2, heldout=2, train_tokens=12, max_tokens=8, k=3,
                              repeats=1, engine="native", concurrency=1, options={})
    lines: list[str] = []
    report = script.check(tiny, prompts, args, lines.append)
    assert set(report["replayed"]) == set(report["measured"]) == set(prompts)
    assert [(r["measured_on"], r["predicted"]) for r in report["predictions"]] == [
        ("repeats", "varied"), ("varied", "repeats")]
    for row in report["predictions"]:
        m, replayed = report["measured"][row["measured_on"]], report["replayed"][row["predicted"]]
        assert row["decoded"] == report["measured"][row["predicted"]]["decoded"]
        assert row["prompts_step_cost"] == pytest.approx(replayed["tau"] / m["step_cost"])
        if m["draft_cost"] is not None:  # priced at the other domain's replayed drafts, a
            # step never below one target-only token (a noisy round here read 0.995)
            assert row["at_replayed_drafts"] == pytest.approx(replayed["tau"] / max(
                MIN_STEP_COST, 1 + m["draft_cost"] * replayed["drafts_per_step"]))
        assert row["error_at_replayed_drafts"] == pytest.approx(
            row["at_replayed_drafts"] / row["decoded"] - 1)
    assert any("measuring speed" in line for line in lines)


@pytest.mark.parametrize("domains", ["json,legal", "json", "json,json"])
def test_domains_it_cannot_check_are_a_usage_error(domains: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    script = _script()
    monkeypatch.setattr("sys.argv", ["step_cost_check.py", "--domains", domains])
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--domains: give two or three of coding, json, support" in err
    assert ("unknown: legal" in err) == ("legal" in domains)

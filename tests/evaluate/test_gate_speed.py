"""The gate compares the measured speedup when there is one, the estimate only when the
evaluation did not measure (and says so)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autospec.evaluate.gate import GatePolicy, decide
from autospec.evaluate.speed import TARGET_ONLY, Decoded, SpeedMeasurement, summarize

from .test_gate import _trial

POLICY = GatePolicy(min_gain=0.05, min_heldout=30, segment_tolerance=0.1,
                    min_segment_requests=10)


def _measured(cand: float, inc: float) -> SpeedMeasurement:
    return SpeedMeasurement(speedup={"cand": cand, "inc": inc},
                            ratios={"cand": [cand] * 3, "inc": [inc] * 3},
                            tokens_per_s={"target-only": 10.0, "cand": 10 * cand,
                                          "inc": 10 * inc},
                            rounds=3, prompts=3, repeats=1, max_tokens=16, k=5,
                            spread={"cand": [cand, cand], "inc": [inc, inc]})


def test_a_candidate_slower_when_measured_is_rejected_whatever_the_estimate() -> None:
    ev = _trial(0, 0.75, 0.5)
    assert ev.speedup["cand"] > ev.speedup["inc"]  # the estimate favours the candidate
    assert decide(POLICY, ev).promote
    slow = replace(ev, measured=_measured(0.9, 1.2))
    assert slow.speed_basis == "measured" and slow.gate_speedup["cand"] == 0.9
    decision = decide(POLICY, slow)
    assert not decision.promote
    (reason,) = [r for r in decision.reasons if "speedup" in r]
    assert reason.startswith("measured speedup 0.90× vs incumbent 1.20× (falls")
    assert "estimated" in reason  # both shown side by side


def test_a_candidate_faster_when_measured_passes_the_speed_check() -> None:
    ev = replace(_trial(0, 0.75, 0.5), measured=_measured(1.5, 1.2))
    decision = decide(POLICY, ev)
    assert decision.promote, decision.reasons
    assert any(r.startswith("measured speedup 1.50× vs incumbent 1.20× (does not fall")
               for r in decision.reasons)


def test_without_measurement_the_gate_uses_the_estimate_and_says_so() -> None:
    ev = _trial(0, 0.75, 0.5)
    assert ev.measured is None and ev.speed_basis == "estimated"
    assert ev.gate_speedup == ev.speedup
    (reason,) = [r for r in decide(POLICY, ev).reasons if "speedup" in r]
    assert reason.startswith("estimated speedup") and "not measured" in reason


def test_the_evaluate_table_shows_estimated_and_measured_side_by_side(capsys,
                                                                       monkeypatch) -> None:
    from rich.console import Console

    from autospec.controller import evaluate_cli as cli
    from autospec.evaluate.run import EvaluationReport

    ev = replace(_trial(0, 0.75, 0.5), measured=_measured(1.5, 1.2))
    monkeypatch.setattr(cli, "out", Console(width=250))  # wide: no wrapped columns
    cli._print(EvaluationReport(ev, decide(POLICY, ev), None, None, None))
    text = capsys.readouterr().out
    assert "est. speedup" in text and "measured speedup" in text and "decoded [IQR]" in text
    assert f"{ev.speedup['cand']:.2f}×" in text and "1.50× [1.50, 1.50]" in text
    assert "median of 3 interleaved rounds: 3 prompts × 1, 16 tokens" in text
    data = cli._as_json(EvaluationReport(ev, None, None, None, None))
    assert data["speed_basis"] == "measured"
    # the JSON carries the figure the table's "measured speedup" column shows and the gate
    # compares, beside the decodes' own median (measured.speedup, the table's "decoded")
    assert data["speedup_measured"] == ev.measured_speedup == data["gate_speedup"]
    for version, figure in ev.measured_speedup.items():
        assert f"{figure:.2f}×" in text
        assert data["measured"]["speedup"][version] == ev.measured.speedup[version]


def test_the_gate_ranks_on_replayed_tau_over_the_measured_step_cost() -> None:
    """A few decoded prompts give a noisy τ: the gate divides the τ replayed over every
    held-out request by the measured cost of a speculative step (in target-only tokens)."""
    ev = _trial(0, 0.75, 0.5)
    m = replace(_measured(1.5, 1.2), step_cost={"cand": 2.0, "inc": 1.0})
    ev = replace(ev, measured=m)
    want = {"cand": ev.tau["cand"] / 2.0, "inc": ev.tau["inc"] / 1.0}
    assert ev.gate_speedup == ev.measured_speedup == want
    assert want["cand"] != 1.5  # not the decoded median
    (reason,) = [r for r in decide(POLICY, ev).reasons if "speedup" in r]
    assert reason.startswith(f"measured speedup {want['cand']:.2f}× vs incumbent "
                             f"{want['inc']:.2f}×")
    assert "decoded 1.50× vs 1.20×" in reason and "step cost" in reason


def test_a_speed_measured_on_vllm_says_at_which_load() -> None:
    m = replace(_measured(1.5, 1.2), engine="vllm", concurrency=4)
    decision = decide(POLICY, replace(_trial(0, 0.75, 0.5), measured=m))
    (reason,) = [r for r in decision.reasons if "speedup" in r]
    assert "interleaved rounds on vLLM at 4 requests in flight" in reason


def test_a_round_without_a_tau_is_left_out_of_the_step_cost() -> None:
    """A decode that took no step (its first token ended it) measures no step cost."""
    decodes = {TARGET_ONLY: [Decoded(10.0, 1.0), Decoded(10.0, 1.0), Decoded(10.0, None)],
               "cand": [Decoded(20.0, 3.0), Decoded(20.0, 3.0), Decoded(5.0, None)]}
    m = summarize(decodes, ["cand"], rounds=3, prompts=3, repeats=1, max_tokens=16, k=5)
    assert m.step_cost == {"cand": 1.5} and m.speedup == {"cand": 2.0}
    assert m.draft_cost == {} and m.drafts_per_step == {}  # no drafts counted
    assert m.projected({"cand": 2.4})["cand"] == pytest.approx(1.6)
    assert m.projected({"cand": None}) == {"cand": 2.0}  # no replayed τ: the decoded median


def test_the_speed_note_says_where_the_decodes_ran():
    """A vLLM measurement has no torch-thread count of its own: the note read "0 torch
    threads" for it; it names the load instead."""
    from autospec.controller.evaluate_cli import speed_note
    from autospec.evaluate.speed import SpeedMeasurement

    common = dict(speedup={"v": 1.2}, ratios={"v": [1.2]},
                  tokens_per_s={"target-only": 30.0, "v": 36.0}, rounds=2, prompts=4,
                  repeats=2, max_tokens=32, k=5)
    native = speed_note(SpeedMeasurement(**common, threads=2))
    vllm = speed_note(SpeedMeasurement(**common, engine="vllm", concurrency=4))
    assert "2 torch threads" in native and "vLLM" not in native
    assert "on vLLM at 4 requests in flight" in vllm and "torch threads" not in vllm


def _rounds(version: str, rounds: list[tuple[float, float, float]]) -> SpeedMeasurement:
    """A measurement of rounds (τ, drafts per step, step cost) of ``version`` against a
    target-only side at 10 tokens/s: each round's rate is 10 · τ ÷ step cost."""
    decodes = {TARGET_ONLY: [Decoded(10.0, 1.0, 0.0) for _ in rounds],
               version: [Decoded(10.0 * t / s, t, d) for t, d, s in rounds]}
    return summarize(decodes, [version], rounds=len(rounds), prompts=len(rounds),
                     repeats=1, max_tokens=32, k=8, engine="vllm", concurrency=4)


def test_a_step_is_priced_at_the_drafts_per_step_the_replay_counted() -> None:
    """An index drafts as much as it matches: the speed prompts it matched best (τ 3.45)
    drafted 5 a step at a step cost of 2.15, where over the held-out set it drafts 2.5 a step
    for τ 2.12. τ 2.12 ÷ 2.15 read 0.98× (2026-12-05, vLLM); a step of 2.5 drafts costs
    1 + 0.23 · 2.5, so the projection is 2.12 ÷ 1.575."""
    m = _rounds("suffix", [(3.45, 5.0, 2.15)] * 3)
    assert m.draft_cost["suffix"] == pytest.approx(0.23)
    assert m.drafts_per_step["suffix"] == pytest.approx(5.0)
    assert m.step_cost_at("suffix", 2.5) == pytest.approx(1.575)
    assert m.projected({"suffix": 2.12}, {"suffix": 2.5})["suffix"] == pytest.approx(
        2.12 / 1.575)
    assert m.projected({"suffix": 2.12})["suffix"] == pytest.approx(2.12 / 2.15)  # no d


def test_a_version_that_drafts_the_same_every_step_keeps_its_measured_step_cost() -> None:
    m = _rounds("eagle3", [(2.4, 5.0, 1.9), (2.9, 5.0, 2.0), (2.1, 5.0, 1.8)])
    assert m.step_cost_at("eagle3", 5.0) == pytest.approx(m.step_cost["eagle3"])
    assert m.projected({"eagle3": 2.5}, {"eagle3": 5.0})["eagle3"] == pytest.approx(2.5 / 1.9)


def test_the_draft_cost_is_the_median_over_the_rounds_that_drafted() -> None:
    """Rounds of 4 and 2 drafts a step at 0.25 a draft, one outlier, and one round that
    drafted nothing (no cost per draft to take from it)."""
    m = _rounds("suffix", [(3.0, 4.0, 2.0), (2.0, 2.0, 1.5), (2.5, 4.0, 2.0),
                           (2.2, 2.0, 1.5), (2.0, 2.0, 4.0), (1.0, 0.0, 1.1)])
    assert m.draft_cost["suffix"] == pytest.approx(0.25)
    assert m.step_cost_at("suffix", 1.0) == pytest.approx(1.25)


def test_the_gate_prices_each_version_at_its_replayed_drafts_per_step() -> None:
    ev = _trial(0, 0.75, 0.5)
    m = replace(_measured(1.5, 1.2), step_cost={"cand": 2.0, "inc": 1.5},
                draft_cost={"cand": 0.25, "inc": 0.1})
    ev = replace(ev, measured=m, draft_tokens_per_step={"cand": 2.0, "inc": 5.0})
    assert ev.gate_speedup == {"cand": pytest.approx(ev.tau["cand"] / 1.5),
                               "inc": pytest.approx(ev.tau["inc"] / 1.5)}
    (reason,) = [r for r in decide(POLICY, ev).reasons if "speedup" in r]
    assert "step cost at the replayed drafts per step" in reason


def test_a_round_compares_rates_after_the_first_token() -> None:
    """The prompt's prefill is the same for both sides and speculation does not change it:
    counted in, it pulls the ratio towards 1 (here 60 tokens/s whole vs 40: 1.5×, where the
    decode after the first token ran 2×); a side without a rate after the first token (one
    token) falls back to whole decodes."""
    base, spec = Decoded(40.0, 1.0, 0.0, 50.0), Decoded(60.0, 2.4, 3.0, 100.0)
    assert spec.ratio(base) == pytest.approx(2.0)
    assert Decoded(60.0, 2.4, 3.0).ratio(base) == pytest.approx(1.5)
    assert spec.ratio(Decoded(0.0, None)) == 0.0
    m = summarize({TARGET_ONLY: [base, Decoded(40.0, 1.0, 0.0, 60.0)], "v": [spec, spec]},
                  ["v"], rounds=2, prompts=2, repeats=1, max_tokens=32, k=5)
    assert m.ratios["v"] == [pytest.approx(2.0), pytest.approx(100 / 60)]
    assert m.step_cost["v"] == pytest.approx((2.4 / 2.0 + 2.4 / (100 / 60)) / 2)
    assert m.decode_tokens_per_s == pytest.approx(55.0)  # the ledger's target-only rate
    assert m.tokens_per_s == {TARGET_ONLY: 40.0, "v": 60.0}  # whole decodes, as before


def test_a_noisy_round_cheaper_than_the_target_never_projects_beyond_tau() -> None:
    """Rounds timed faster than their τ allows (step cost 0.9 at 1 draft a step: a cost per
    draft of −0.1) priced at the replay's 9.5 drafts a step gave 1 − 0.95 = 0.05, and an
    index of τ 1.02 read 20×; in CI it read 105.82× and the gate rejected the better
    candidate. A step costs at least one target-only token."""
    m = _rounds("ngram", [(1.02, 1.0, 0.9)] * 3)
    assert m.draft_cost["ngram"] == pytest.approx(-0.1)
    assert m.step_cost_at("ngram", 9.5) == 1.0
    assert m.step_cost_at("ngram", None) == 1.0  # the median step cost (0.9), floored too
    assert m.projected({"ngram": 1.02}, {"ngram": 9.5})["ngram"] == pytest.approx(1.02)
    assert m.projected({"ngram": 1.02})["ngram"] == pytest.approx(1.02)


def test_evaluate_reads_a_window_as_train_does() -> None:
    """``500``, ``24h`` or both (``7d:500``), as ``autospec train --window``."""
    from datetime import timedelta

    from autospec.controller.evaluate_cli import parse_window

    assert parse_window("500") == {"last": 500}
    assert parse_window("24h") == {"since": timedelta(hours=24)}
    assert parse_window("7d:500") == {"since": timedelta(days=7), "last": 500}

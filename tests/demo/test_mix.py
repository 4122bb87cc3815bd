"""The demo's mixed traffic (M1, a per-segment cycle, M2) and its comparison "against one":
the per-segment figures from the responses, the policy's per-segment threshold against the
window the demo holds out, and the report's section. No Ray and no model: serving, the
target, the controller and the replay are fakes (the end-to-end demo is ``test_demo.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autospec import store
from autospec.controller.result import CycleResult
from autospec.demo.mix import compare, mix_lines, segment_moves
from autospec.demo.phases import segment_figures
from autospec.demo.plan import demo_policy, heldout_rows, mix_sizes, plan_for
from autospec.demo.record import PhaseFigures, SegmentFigures
from autospec.demo.report import write_json, write_markdown
from autospec.demo.run import Demo
from autospec.loadgen.client import Result


def _result(segment: str, *, version: str, tau: float, tokens: int, latency: float,
            ok: bool = True) -> Result:
    return Result(index=0, segment=segment, start_s=0.0, latency_s=latency, ok=ok,
                  version=version, completion_tokens=tokens, num_drafts=tokens,
                  num_accepted_tokens=round(tokens * (tau - 1)), tau=tau)


def test_segment_figures_split_a_mixed_phase_by_segment() -> None:
    j1 = _result("json", version="v-a", tau=3.0, tokens=60, latency=2.0)
    s1 = _result("support", version="v-b", tau=1.5, tokens=60, latency=4.0)
    j2 = _result("json", version="v-a", tau=3.0, tokens=60, latency=2.0)
    bad = _result("support", version="v-b", tau=1.5, tokens=0, latency=1.0, ok=False)
    tj = _result("json", version="off", tau=1.0, tokens=60, latency=6.0)
    ts = _result("support", version="off", tau=1.0, tokens=60, latency=5.0)
    figures = segment_figures([j1, s1, j2, bad], [(j1, tj), (s1, ts)])
    assert list(figures) == ["json", "support"]
    json_, support = figures["json"], figures["support"]
    assert json_.requests == 2 and json_.versions == {"v-a": 2} and json_.served_by == "v-a"
    assert json_.tokens_per_s == pytest.approx(30.0)
    assert json_.speedup == pytest.approx(30.0 / 10.0) and json_.paired_prompts == 1
    assert support.requests == 2 and support.versions == {"v-b": 1}  # the failed one: none
    assert support.speedup == pytest.approx(15.0 / 12.0)


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_each_segment_of_the_mixed_window_can_reach_the_per_segment_threshold(mode) -> None:  # type: ignore[no-untyped-def]
    """M1 fills the held-out part of the next window alternating two domains; each gets at
    least the policy's ``per_segment.min_requests`` of it."""
    plan = plan_for(mode)
    before, after = mix_sizes(plan)
    assert before + after == plan.requests_per_phase and before >= heldout_rows(plan)
    policy = demo_policy(plan)
    per_segment = policy.promotion.per_segment
    assert per_segment.enabled and per_segment.min_requests == heldout_rows(plan) // 2
    assert policy.window.max_requests == plan.requests_per_phase
    assert policy.gate.min_heldout <= heldout_rows(plan)


def _mixed_phase() -> PhaseFigures:
    phase = PhaseFigures(name="M2", title="mix", domain="json+support", start_t=0.0)
    phase.segments = {
        "json": SegmentFigures("json", requests=12, versions={"eagle3-1": 12}, tau_live=2.8,
                               speedup=1.9, paired_prompts=3),
        "support": SegmentFigures("support", requests=12, versions={"suffix-2": 12},
                                  tau_live=1.6, speedup=1.2, paired_prompts=3)}
    return phase


def test_the_comparison_names_what_served_each_segment_against_the_one_version() -> None:
    cycle = CycleResult("promoted", segments=[
        {"segment": "json", "action": "promoted", "version": "eagle3-1", "reason": "wins"},
        {"segment": "support", "action": "follows", "version": "suffix-2", "reason": "f"}])
    events = [{"at": "t1", "kind": "promotion", "version": "eagle3-1", "actor": "controller",
               "reason": "segment 'json': wins", "from_version": None,
               "details": {"segment": "json"}},
              {"at": "t0", "kind": "promotion", "version": "suffix-2", "actor": "controller",
               "reason": "deployment", "from_version": "x", "details": {}}]
    mix = compare(_mixed_phase(), deployment_version="suffix-2",
                  pointers={"json": "eagle3-1"}, moves=segment_moves(events), cycle=cycle,
                  shadow={"json": {"eagle3-1": (2.9, 12), "suffix-2": (2.1, 12)},
                          "support": {"suffix-2": (1.7, 12)}})
    assert mix["note"] == "the cycle moved segment 'json' to eagle3-1"
    json_, support = mix["segments"]
    assert (json_["served_by"], json_["shadow_served"], json_["shadow_one"]) == \
        ("eagle3-1", 2.9, 2.1)
    assert (support["served_by"], support["shadow_served"], support["shadow_one"]) == \
        ("suffix-2", 1.7, 1.7)
    assert [m["segment"] for m in mix["moves"]] == ["json"]
    text = "\n".join(mix_lines(mix))
    assert "segment pointers in the store: json → eagle3-1" in text
    assert "| json | eagle3-1 | eagle3-1 | 12 | 2.80 | 1.90× (3) | 12 | 2.90 | 2.10 | 1.38 |" \
        in text
    assert "| support | suffix-2 | follows | 12 | 1.60 | 1.20× (3) | 12 | 1.70 | 1.70 | 1.00 |" \
        in text


def test_a_cycle_that_moved_no_segment_pointer_says_why() -> None:
    cycle = CycleResult("rejected", reasons=["gate: no candidate passed"], segments=[
        {"segment": "json", "action": "kept", "version": None,
         "reason": "no candidate beats suffix-2 on the segment's 7 held-out requests"},
        {"segment": "support", "action": "too_few", "version": None,
         "reason": "5 held-out requests; per-segment promotion needs 7"}])
    mix = compare(_mixed_phase(), deployment_version="suffix-2", pointers={}, moves=[],
                  cycle=cycle, shadow={})
    assert mix["note"].startswith("the cycle moved no segment pointer — 'json' kept: no "
                                  "candidate beats suffix-2")
    assert "'support' too_few: 5 held-out requests" in mix["note"]
    empty = compare(_mixed_phase(), deployment_version="suffix-2", pointers={}, moves=[],
                    cycle=CycleResult("failed", reasons=["training failed"]), shadow={})
    assert empty["note"] == ("the cycle (failed) decided no segment, so it moved no segment "
                             "pointer: training failed")
    assert "| json | eagle3-1 | follows | 12 | 2.80 | 1.90× (3) | 0 | — | — | — |" in \
        "\n".join(mix_lines(empty))


class _Driver:
    """Answers at once; json on ``v-json`` once the segment has a pointer, else on the
    built-in version (the fake cycles move no pointer in the store)."""

    def __init__(self, pointed: dict[str, str]) -> None:
        self.pointed, self.url = pointed, "http://fake"

    def send(self, prompt, start_s: float) -> Result:  # type: ignore[no-untyped-def]
        version = self.pointed.get(prompt.segment, "builtin-ngram")
        return _result(prompt.segment, version=version, tau=2.0, tokens=8, latency=0.1)


def test_the_demo_story_ends_with_the_mixed_phases_and_their_comparison(
        monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pointed: dict[str, str] = {}
    cycles: list[str] = []

    def cycle(self, after: str) -> CycleResult:  # type: ignore[no-untyped-def]
        cycles.append(after)
        if after != "M1":
            return CycleResult("promoted")
        pointed["json"] = "v-json"  # what the replica would pick up from the pointer
        return CycleResult("promoted", segments=[
            {"segment": "json", "action": "promoted", "version": "v-json", "reason": "wins"}])

    def start(self) -> None:  # type: ignore[no-untyped-def]
        self.live, self.baseline = _Driver(pointed), _Driver({})

    monkeypatch.setattr(Demo, "_start_serving", start)
    monkeypatch.setattr(Demo, "_stop_serving", lambda self: None)
    monkeypatch.setattr(Demo, "_load_target", lambda self: None)
    monkeypatch.setattr(Demo, "_shadow_tau", lambda self, phase, n: None)
    monkeypatch.setattr(Demo, "_wait_logged", lambda self, timeout_s=30.0: None)
    monkeypatch.setattr(Demo, "_wait_for_segments", lambda self: None)
    monkeypatch.setattr(Demo, "_cycle", cycle)
    monkeypatch.setattr(Demo, "_watch", lambda self, after, window_s, quiet=False:
                        SimpleNamespace(action="none"))
    replayed: list[dict[str, list[str]]] = []

    def shadow(self, phase, versions):  # type: ignore[no-untyped-def]
        replayed.append(versions)
        return {s: {v: (2.5 if v == "v-json" else 2.0, 3) for v in vs}
                for s, vs in versions.items()}

    monkeypatch.setattr(Demo, "_segment_shadow", shadow)
    plan = plan_for("quick").with_overrides(requests_per_phase=8)
    result = Demo(plan, data_dir=tmp_path / "data").run()
    assert [p.name for p in result.phases] == ["A1", "A2", "B1", "B2", "M1", "M2"]
    assert cycles == ["A1", "B1", "M1"]  # no drift in this fake: B1's scheduled cycle runs
    m1, m2 = result.phases[-2:]
    assert (m1.requests, m2.requests) == mix_sizes(plan)
    assert m1.segments["json"].served_by == "builtin-ngram"
    assert m2.segments["json"].served_by == "v-json"
    assert m2.segments["support"].served_by == "builtin-ngram"
    assert m2.segments["json"].paired_prompts >= 1 and m2.segments["support"].paired_prompts >= 1
    # the store has no live pointer: the deployment's version is the built-in one
    assert replayed == [{"json": ["v-json", "builtin-ngram"], "support": ["builtin-ngram"]}]
    assert result.mix is not None
    assert result.mix["deployment_version"] == "builtin-ngram"
    assert result.mix["note"] == "the cycle moved segment 'json' to v-json"
    write_json(result, tmp_path / "demo.json")
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["mix"]["segments"][0]["shadow_served"] == 2.5
    assert data["phases"][-1]["segments"]["json"]["served_by"] == "v-json"
    write_markdown(result, tmp_path / "report.md", None)
    assert "## Mixed traffic (M2): per-segment versions against one" in \
        (tmp_path / "report.md").read_text()
    with store.session_scope(store.open_store(f"sqlite:///{tmp_path / 'data' / 'autospec.db'}",
                                              upgrade=False), readonly=True) as session:
        assert store.list_segment_pointers(session) == []  # the fakes moved none


def test_a_cycle_that_moved_only_a_segment_pointer_is_noted_with_that_segment_reason() -> None:
    """Outcome ``promoted`` with no deployment version: the decision carries the segment's
    reason (the candidates' own reasons are all failures of the deployment-wide gate)."""
    from autospec.demo.control import ControllerSteps
    from autospec.demo.record import Timeline

    result = CycleResult("promoted", reasons=["s-3: Δτ CI low < +0.05"], segments=[
        {"segment": "json", "action": "kept", "reason": "no candidate beats v-1"},
        {"segment": "support", "action": "promoted", "version": "s-3",
         "reason": "segment 'support': s-3 wins on its 8 held-out requests"}])
    said: list = []  # str, or a rich Text (styled; printed as written)
    waited: list[str | None] = []
    timeline = Timeline()
    steps = ControllerSteps(
        timeline=timeline, say=said.append, wait_logged=lambda: None,
        controller=lambda w: SimpleNamespace(run_cycle=lambda trigger: result),
        wait_for_version=waited.append, stage=lambda name: _nothing())
    assert steps.cycle("M1") is result
    note = timeline.decisions[-1]
    assert note.outcome == "promoted" and note.version is None
    assert note.reasons == ["s-3: Δτ CI low < +0.05",
                            "segment 'support': s-3 wins on its 8 held-out requests"]
    assert str(said[-1]).endswith("— segment 'support': s-3 wins on its 8 held-out requests")
    assert waited == []  # the deployment's pointer did not move


def _nothing():  # type: ignore[no-untyped-def]
    from contextlib import nullcontext

    return nullcontext()

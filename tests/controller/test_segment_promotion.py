"""Per-segment promotion's decision and its pointer moves, on evaluations built from
synthetic replay results (no model): a candidate that wins one segment gets that segment's
pointer; a segment the deployment's winner wins needs none; a segment with its own pointer
is compared with that pointer's version; too few requests, no winner, a moved pointer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autospec import store
from autospec.controller.candidates import Candidate
from autospec.controller.result import CycleResult
from autospec.controller.segment_promotion import apply, plan, with_segment_versions
from autospec.evaluate.compare import Costs, compare
from autospec.evaluate.replay import ReplayStats
from tests.store.test_registry import register

from .helpers import fast_policy

K = 4
COSTS = Costs(step_s=0.05, verify_s={1: 0.05, 5: 0.06})


def _stats(rng: np.random.Generator, rate: float, n: int, draft_s: float = 0.001) -> list:
    """``n`` requests' replay stats, each step accepting a prefix at per-position ``rate``."""
    out = []
    for _ in range(n):
        s = ReplayStats()
        for _ in range(20):
            accepted = 0
            while accepted < K and rng.random() < rate:
                accepted += 1
            s.observe(K, [1.0] * accepted)
        s.draft_s = draft_s * s.steps
        out.append(s)
    return out


def _candidate(version: str, rates: dict[str, dict[str, float]], sizes: dict[str, int], *,
               others: tuple[str, ...] = ("inc",), promote: bool = False,
               slow: float = 0.001, seed: int = 0) -> Candidate:
    """A candidate evaluated against ``others`` on segments of ``sizes`` requests, each
    version accepting at ``rates[version][segment]`` (the same seed per version and
    segment in every candidate's evaluation: the same held-out replay)."""
    segments = [s for s, n in sizes.items() for _ in range(n)]
    results = {}
    for v in (version, *others):
        stats = []
        for i, (seg, n) in enumerate(sizes.items()):
            rng = np.random.default_rng([seed, i, sum(map(ord, v))])
            stats += _stats(rng, rates[v][seg], n, slow if v == version else 0.001)
        results[v] = stats
    ev = compare(results, segments, COSTS, k=K, resamples=500)
    return Candidate(version, 1, evaluation_id=7, tau=ev.tau[version], promote=promote,
                     evaluation=ev)


RATES = {"inc": {"json": 0.3, "chat": 0.3, "tiny": 0.3},
         "c1": {"json": 0.3, "chat": 0.8, "tiny": 0.3},   # better on chat
         "c2": {"json": 0.85, "chat": 0.3, "tiny": 0.9},  # better on json (and tiny)
         "old": {"json": 0.9, "chat": 0.3, "tiny": 0.3}}  # a segment pointer's version
SIZES = {"json": 40, "chat": 40, "tiny": 5}


def _registered(engine, tmp_path: Path, *versions: str) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in versions:
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="t", reason="deployment")


def _by_segment(outcomes) -> dict:  # type: ignore[no-untyped-def]
    return {o.segment: o for o in outcomes}


def _two_candidates(engine, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Registered versions inc, c1 (passes the deployment's gate) and c2; a per-segment
    policy deciding segments of 10 held-out requests; an empty cycle result."""
    _registered(engine, tmp_path, "inc", "c1", "c2")
    policy = fast_policy(promotion={"per_segment": {"enabled": True, "min_requests": 10}})
    c1 = _candidate("c1", RATES, SIZES, promote=True)
    c2 = _candidate("c2", RATES, SIZES)
    return policy, c1, c2, CycleResult("failed", cycle_id="cyc", window_key="default/9/85")


def test_each_segment_gets_the_candidate_that_wins_on_it(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    policy, c1, c2, result = _two_candidates(engine, tmp_path)
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c1, c2], best=c1))
        assert outcomes["chat"].action == "follows" and outcomes["chat"].version == "c1"
        assert outcomes["json"].action == "promoted" and outcomes["json"].version == "c2"
        assert outcomes["tiny"].action == "too_few" and outcomes["tiny"].requests == 5
        json = outcomes["json"]
        assert json.serving == "inc" and json.delta[1] >= policy.gate.min_gain
        assert json.tau > json.serving_tau and json.speed_basis == "estimated"
        moved = apply(s, list(outcomes.values()), policy=policy, actor="ctl", result=result,
                      token=3)
    assert moved == {"c2"}
    assert [d["segment"] for d in result.segments] == ["chat", "json", "tiny"]
    with store.session_scope(engine, readonly=True) as s:
        assert store.serving_version(s, segment="json") == "c2"
        assert store.get_live(s, segment="chat") is None  # follows the deployment's pointer
        assert store.get_live(s).version == "inc"  # apply never moves the deployment's
        (event,) = [e for e in store.list_events(s, kinds=["promotion"]) if e.version == "c2"]
    assert event.details["segment"] == "json" and event.details["incumbent"] == "inc"
    assert event.details["shadow_tau"] == json.tau and event.details["fencing_token"] == 3
    assert "segment 'json'" in event.reason and "evaluation #7" in event.reason
    assert "cost model" in event.reason and "cycle cyc" in event.reason


def _suffix_versions(engine, tmp_path: Path, *versions: str) -> None:  # type: ignore[no-untyped-def]
    """``versions`` registered as suffix versions (the kind a vLLM replica holds per segment)."""
    from autospec.store.artifacts import artifact_sha256
    from tests.store.test_registry import make_artifact

    with store.session_scope(engine) as s:
        for v in versions:
            uri = make_artifact(tmp_path, v)
            store.register_speculator(s, version=v, kind="suffix", target_id="smollm2-135m",
                                      artifact_uri=uri, sha256=artifact_sha256(uri))
        store.set_live(s, version="inc", actor="t", reason="deployment")


def test_on_a_vllm_deployment_suffix_versions_get_segment_pointers(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM replicas hold a suffix version per segment beside the deployment's suffix version
    (autospec's proposer): the winner's pointer moves, as on the native engine."""
    _suffix_versions(engine, tmp_path, "inc", "c1", "c2")
    policy = fast_policy(promotion={"per_segment": {"enabled": True, "min_requests": 10}})
    c1, c2 = _candidate("c1", RATES, SIZES, promote=True), _candidate("c2", RATES, SIZES)
    result = CycleResult("failed", cycle_id="cyc", window_key="default/9/85")
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c1, c2], best=c1,
                                    engine="vllm"))
        assert outcomes["json"].action == "promoted" and outcomes["json"].version == "c2"
        assert apply(s, list(outcomes.values()), policy=policy, actor="ctl", result=result,
                     token=3) == {"c2"}


def test_on_a_vllm_deployment_a_segment_winner_is_named_not_promoted(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM replicas draft every segment with the deployment's version: a segment pointer
    would not be followed and its canary would wait for requests that never come."""
    policy, c1, c2, result = _two_candidates(engine, tmp_path)
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c1, c2], best=c1,
                                    engine="vllm"))
        json = outcomes["json"]
        assert json.action == "not_followed" and json.version == "c2"
        assert "wins on its" in json.reason and "serves on vLLM" in json.reason
        assert "the segment's c2 is of kind eagle3" in json.reason
        assert outcomes["chat"].action == "follows"  # the deployment's winner: served anyway
        moved = apply(s, list(outcomes.values()), policy=policy, actor="ctl", result=result,
                      token=3)
    assert moved == set()
    with store.session_scope(engine, readonly=True) as s:
        assert store.list_segment_pointers(s, deployment="default") == []


def test_a_segment_with_its_own_pointer_is_judged_against_it(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _registered(engine, tmp_path, "inc", "c2", "old")
    with store.session_scope(engine) as s:
        store.set_live(s, version="old", actor="t", reason="json", segment="json")
    policy = fast_policy(promotion={"per_segment": {"min_requests": 10}})
    assert with_segment_versions(engine, policy, ["c2", "inc"]) == ["c2", "inc", "old"]
    off = fast_policy(promotion={"per_segment": {"enabled": False}})
    assert with_segment_versions(engine, off, ["c2", "inc"]) == ["c2", "inc"]
    c2 = _candidate("c2", RATES, SIZES, others=("inc", "old"))
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c2], best=None))
        assert plan(s, policy=off, candidates=[c2], best=None) == []
    # c2 beats the deployment's inc on json, but not json's own version, old
    assert outcomes["json"].serving == "old" and outcomes["json"].own_pointer
    assert outcomes["json"].action == "kept" and outcomes["json"].version is None
    assert "c2 Δτ " in outcomes["json"].reason  # how far it fell short, against old
    assert outcomes["chat"].action == "kept" and outcomes["chat"].serving == "inc"


def test_the_deployment_winner_takes_a_segment_with_its_own_pointer(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _registered(engine, tmp_path, "inc", "c2", "x")
    with store.session_scope(engine) as s:
        store.set_live(s, version="x", actor="t", reason="json", segment="json")
    rates = {**RATES, "x": {"json": 0.2, "chat": 0.3, "tiny": 0.3}}
    c2 = _candidate("c2", rates, SIZES, others=("inc", "x"), promote=True)
    policy = fast_policy(promotion={"per_segment": {"min_requests": 10}})
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c2], best=c2))
    # json's own pointer would keep serving x: it moves to the deployment's winner too
    assert outcomes["json"].action == "promoted" and outcomes["json"].version == "c2"


def test_a_pointer_moved_during_the_cycle_is_stale(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _registered(engine, tmp_path, "inc", "c2", "new")
    c2 = _candidate("c2", RATES, SIZES)  # evaluated before json got its own pointer
    with store.session_scope(engine) as s:
        store.set_live(s, version="new", actor="op", reason="by hand", segment="json")
    policy = fast_policy(promotion={"per_segment": {"min_requests": 10}})
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c2], best=None))
    assert outcomes["json"].action == "stale" and "new" in outcomes["json"].reason
    assert outcomes["chat"].action == "kept"


def test_a_segment_win_that_decodes_slower_is_not_taken(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _registered(engine, tmp_path, "inc", "c2")
    slow = _candidate("c2", RATES, SIZES, slow=0.5)  # 0.5 s to propose each step
    fast = _candidate("c2", RATES, SIZES)
    json_slow = next(s for s in slow.evaluation.segments if s.segment == "json")
    assert json_slow.deltas["inc"].low > 0.05  # it does accept better...
    assert json_slow.speedup["c2"] < json_slow.speedup["inc"]  # ...but decodes slower
    policy = fast_policy(promotion={"per_segment": {"min_requests": 10}})
    with store.session_scope(engine) as s:
        kept = _by_segment(plan(s, policy=policy, candidates=[slow], best=None))["json"]
        assert _by_segment(plan(s, policy=policy, candidates=[fast], best=None))[
            "json"].action == "promoted"
    # the reason says what kept it: the Δτ passes, the speedups do not
    speeds = (json_slow.speedup["c2"], json_slow.speedup["inc"])
    assert kept.action == "kept" and kept.version is None
    assert f"estimated speedup {speeds[0]:.2f}× vs {speeds[1]:.2f}×" in kept.reason, kept.reason


def test_segment_results_compare_the_candidate_with_every_other_version() -> None:
    c2 = _candidate("c2", RATES, SIZES, others=("inc", "old"))
    json = next(s for s in c2.evaluation.segments if s.segment == "json")
    assert set(json.deltas) == {"inc", "old"} and json.delta == json.deltas["inc"]
    assert json.deltas["inc"].low > 0 > json.deltas["old"].high  # beats inc, loses to old
    assert set(json.speedup) == {"c2", "inc", "old"}


def test_a_segment_logged_under_a_name_no_pointer_takes_is_kept_not_promoted(
        engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Rows logged before the segment header took only store names ('team/json') stay in
    the deployment's evaluation; the cycle names them and promotes the rest, instead of
    failing its whole conclusion on the pointer's name."""
    _registered(engine, tmp_path, "inc", "c1", "c2")
    policy = fast_policy(promotion={"per_segment": {"enabled": True, "min_requests": 10}})
    sizes = {"team/json": 40, "chat": 40}
    rates = {v: {"team/json": r["json"], "chat": r["chat"]} for v, r in RATES.items()}
    c1, c2 = (_candidate("c1", rates, sizes, promote=True), _candidate("c2", rates, sizes))
    result = CycleResult("failed", cycle_id="cyc", window_key="default/9/85")
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c1, c2], best=c1))
        assert outcomes["team/json"].action == "kept"
        assert "cannot name a pointer" in outcomes["team/json"].reason
        assert outcomes["chat"].action == "follows"
        assert apply(s, list(outcomes.values()), policy=policy, actor="ctl", result=result,
                     token=3) == set()


@pytest.mark.parametrize("name", ["team/json", "a b", "", "json\n", "x" * 65, "-json"])
def test_the_segment_header_and_rules_name_segments_as_the_store_does(name: str) -> None:
    from pydantic import ValidationError

    from autospec.serve.segments import SegmentRule
    from autospec.store.registry import check_name

    assert SegmentRule(segment="team-json", model="m").segment == "team-json"
    check_name("segment", "team-json")
    with pytest.raises(ValidationError):
        SegmentRule(segment=name, model="m")
    with pytest.raises(store.StoreError):
        check_name("segment", name)


def test_a_segment_is_sized_by_the_fewest_requests_any_candidate_was_evaluated_on(
        engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """c2's training took most of json out of its held-out set: 6 requests are left, under
    the 10 per-segment promotion needs, whatever c1 (evaluated first) was evaluated on."""
    _registered(engine, tmp_path, "inc", "c1", "c2")
    policy = fast_policy(promotion={"per_segment": {"enabled": True, "min_requests": 10}})
    c1 = _candidate("c1", RATES, SIZES, promote=True)
    c2 = _candidate("c2", RATES, {**SIZES, "json": 6})
    with store.session_scope(engine) as s:
        outcomes = _by_segment(plan(s, policy=policy, candidates=[c1, c2], best=c1))
    assert outcomes["json"].action == "too_few" and outcomes["json"].requests == 6

"""Per-segment promotion in real cycles on a tiny random-init target: two segments end up
served by two different versions, and the canary rolls one segment back.

Cycle 1 learns the ``json`` segment's repeated prompts (a suffix index) and becomes the
deployment's version. Then the traffic shifts: a ``support`` segment with prompts of its
own arrives, and cycle 2's window trains only on support traffic (``max_requests`` keeps
the newest), while its held-out part holds both segments. Its candidate forgets json — the
deployment-wide gate rejects it for json's regression — but wins support by far: support
gets its own pointer, json stays with cycle 1's version."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.watch import Watcher

from .helpers import T0, fast_policy, greedy_traffic

PER_SEGMENT = {"per_segment": {"enabled": True, "min_requests": 5}}
GATE = {"min_segment_requests": 5}


def _log(engine, pairs, segments, *, start) -> None:  # type: ignore[no-untyped-def]
    store.write_requests(engine, [
        store.RequestRecord(prompt_ids=p, output_ids=o, segment=seg,
                            created_at=start + timedelta(seconds=i))
        for i, ((p, o), seg) in enumerate(zip(pairs, segments, strict=True))])


def _serving(engine, segment: str) -> str | None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine, readonly=True) as session:
        return store.serving_version(session, segment=segment)


def test_two_segments_get_two_versions_and_a_segment_canary_rolls_back(db, tiny) -> None:  # type: ignore[no-untyped-def]
    json = greedy_traffic(tiny, seed=0)  # 4 prompts x 10
    support = greedy_traffic(tiny, seed=1, repeats=17)  # 4 other prompts x 17
    _log(db, json, ["json"] * len(json), start=T0)
    first = Controller(db, fast_policy(gate=GATE, promotion=PER_SEGMENT), tiny).run_cycle()
    assert first.outcome == "promoted", first.reasons
    assert [(s["segment"], s["action"]) for s in first.segments] == [("json", "follows")]
    with store.session_scope(db, readonly=True) as session:
        assert store.list_segment_pointers(session) == []  # no redundant pointer

    # 56 support requests (the train part), then 12 of each segment interleaved (held out)
    held = [pair for i in range(12) for pair in (json[i], support[56 + i])]
    _log(db, support[:56] + held, ["support"] * 56 + ["json", "support"] * 12,
         start=T0 + timedelta(minutes=10))
    policy = fast_policy(gate=GATE, promotion=PER_SEGMENT, window={"max_requests": 80},
                         training={"from_scratch": True})
    second = Controller(db, policy, tiny).run_cycle()
    assert second.outcome == "promoted" and second.promoted is None, second.reasons
    assert any("segment 'json'" in r and "regresses" in r for r in second.reasons)
    seg = {s["segment"]: s for s in second.segments}
    assert seg["support"]["action"] == "promoted", seg
    assert seg["support"]["version"] == second.candidates[0]
    assert seg["support"]["serving"] == first.promoted and seg["support"]["requests"] == 12
    assert seg["json"]["action"] == "kept"
    assert _serving(db, "support") == second.candidates[0]
    assert _serving(db, "json") == first.promoted  # two segments, two versions
    with store.session_scope(db, readonly=True) as session:
        assert store.get_speculator(session, version=second.candidates[0]).state == "live"
        (promo,) = [e for e in store.list_events(session, kinds=["promotion"])
                    if (e.details or {}).get("segment") == "support"]
        (note,) = [n for n in store.list_events(session, kinds=["note"])
                   if (n.details or {}).get("cycle_id") == second.cycle_id
                   and n.details["type"] == "cycle"]
    assert f"evaluation #{seg['support']['evaluation_id']}" in promo.reason
    assert promo.details["shadow_tau"] == seg["support"]["tau"]
    assert note.details["segments"] == second.segments

    # the support segment's live acceptance falls far short of its shadow τ: rolled back
    store.write_requests(db, [store.RequestRecord(
        speculator_version=second.candidates[0], segment="support", num_drafts=10,
        num_draft_tokens=40, num_accepted_tokens=0, opted_out=True) for _ in range(10)])
    watched = Watcher(Controller(db, policy, tiny)).run()
    assert watched.action == "rolled_back" and watched.segment == "support", watched.reasons
    assert _serving(db, "support") == first.promoted
    assert _serving(db, "json") == first.promoted

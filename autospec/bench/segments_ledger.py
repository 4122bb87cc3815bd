"""The ledger's check in ``autospec bench segments``: does the decode time the ledger says
speculation saved agree with the difference measured by decoding the same requests again
target-only? (Issue 29's goal: within :data:`LEDGER_TOLERANCE`.)

The *period* is the segment arm's decodes (each request drafted by its segment's version,
as a replica with per-segment pointers serves it). The ledger's arithmetic
(:func:`autospec.ledger.tally`) is run on them as the store would hold them — output tokens
after the first, seconds after the first token — with **R** measured as the gate measures
it (:func:`autospec.evaluate.speed.measure_speedups`' target-only tokens/s after the first
token, here the median over the segments' picking measurements). The replay is the
target-only arm: the same requests, decoded in the same rounds, timed the same way.
Measures nothing itself."""

from __future__ import annotations

import statistics

from autospec.bench.segments_measure import GLOBAL, SEGMENT, TARGET_ONLY
from autospec.ledger import Rate, tally
from autospec.store.ledger import DecodeRow

#: the issue's goal: the ledger's saved seconds within 25 % of the replayed difference
LEDGER_TOLERANCE = 0.25


def decode_seconds(rec: dict, arm: str) -> float:
    """A round's seconds after the first token for ``arm`` (latency − TTFT, as logged)."""
    return rec["seconds"][arm] - rec["ttft"][arm]


def gate_rate(picks: dict) -> float:
    """R: the median of the target-only tokens/s after the first token each segment's
    picking measurement decoded (the gate's measurement, on other held-out prompts than the
    period's), as the ledger reads it from an evaluation."""
    return statistics.median(p.get("decode_tokens_per_s") or p["tokens_per_s"][TARGET_ONLY]
                             for p in picks["segments"].values())


def ledger_check(measured: dict, picks: dict, arm: str = SEGMENT) -> dict:
    """The ledger of ``arm``'s decodes against their target-only replay (module doc)."""
    if arm not in (GLOBAL, SEGMENT):
        raise ValueError(f"no arm {arm!r}: {GLOBAL} or {SEGMENT}")
    rounds = [r for r in measured["rounds"] if r["tokens"][arm] > 1]
    rows = [DecodeRow(segment=r["segment"], version=r["version"][arm],
                      tokens=r["tokens"][arm] - 1, seconds=decode_seconds(r, arm),
                      concurrency=None) for r in rounds]
    rate = gate_rate(picks)
    total, _ = tally(rows, Rate(tokens_per_s=rate, engine="native", concurrency=1,
                                evaluations=[]))
    replay_s = sum(decode_seconds(r, TARGET_ONLY) for r in rounds)
    measured_saved = replay_s - total.decode_s
    error = (abs(total.saved_s - measured_saved) / measured_saved
             if measured_saved > 0 else None)
    return {"arm": arm, "requests": total.requests, "tokens": total.tokens,
            "rate_tokens_per_s": rate, "decode_s": total.decode_s,
            "ledger_baseline_s": total.baseline_s, "ledger_saved_s": total.saved_s,
            "replay_target_only_s": replay_s, "replay_saved_s": measured_saved,
            "relative_error": error, "tolerance": LEDGER_TOLERANCE,
            "reached": error is not None and error <= LEDGER_TOLERANCE}


def ledger_text(check: dict) -> str:
    """The check in one line."""
    if check["relative_error"] is None:
        return (f"ledger check: speculation saved nothing measurable on the replay "
                f"({check['replay_saved_s']:.3f} s), so the ledger cannot be judged")
    return (f"ledger check (saved within {check['tolerance']:.0%} of a target-only replay): "
            f"{'reached' if check['reached'] else 'NOT reached'} — ledger "
            f"{check['ledger_saved_s']:.2f} s saved (R {check['rate_tokens_per_s']:.1f} "
            f"tokens/s) vs replay {check['replay_saved_s']:.2f} s "
            f"({check['relative_error']:.0%} off) over {check['requests']} requests")

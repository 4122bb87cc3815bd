"""The ledger's check in ``autospec bench segments``: does the decode time the ledger says
speculation saved agree with the difference measured by decoding the same requests again
target-only? (Issue 29's goal: within :data:`LEDGER_TOLERANCE`.)

The *period* is the segment arm's decodes (each request drafted by its segment's version,
as a replica with per-segment pointers serves it). The ledger's arithmetic
(:func:`autospec.ledger.tally`) is run on them as the store would hold them — output tokens
after the first, seconds after the first token. The replay is the target-only arm: the
same requests, decoded in the same rounds, timed the same way. Two checks, one per way the
ledger finds **R**:

- :func:`ledger_check`, R as the gate measures it
  (:func:`autospec.evaluate.speed.measure_speedups`' target-only tokens/s after the first
  token, the median over the segments' picking measurements: other prompts, minutes
  earlier);
- :func:`holdout_check`, R from a holdout (:mod:`autospec.serve.holdout`): every
  :data:`HOLDOUT_EVERY`-th request of the period is served target-only instead (its
  target-only arm's decode, marked held out) and R is those requests' rate
  (:func:`autospec.ledger.holdout_rate`); the check is on the other requests, whose
  target-only decodes the ledger never saw.

Measures nothing itself."""

from __future__ import annotations

import statistics

from autospec.bench.segments_measure import GLOBAL, SEGMENT, TARGET_ONLY, decode_seconds
from autospec.ledger import Rate, holdout_rate, tally
from autospec.store.ledger import DecodeRow

#: the issue's goal: the ledger's saved seconds within 25 % of the replayed difference
LEDGER_TOLERANCE = 0.25
#: one request in this many of the period is held out in :func:`holdout_check`
HOLDOUT_EVERY = 3


def gate_rate(picks: dict) -> float:
    """R: the median of the target-only tokens/s after the first token each segment's
    picking measurement decoded (the gate's measurement, on other held-out prompts than the
    period's), as the ledger reads it from an evaluation."""
    return statistics.median(p.get("decode_tokens_per_s") or p["tokens_per_s"][TARGET_ONLY]
                             for p in picks["segments"].values())


def _row(rec: dict, arm: str, *, holdout: bool = False) -> DecodeRow:
    return DecodeRow(segment=rec["segment"], version=rec["version"][arm],
                     tokens=rec["tokens"][arm] - 1, seconds=decode_seconds(rec, arm),
                     concurrency=None, holdout=holdout)


def _timed(measured: dict, arm: str) -> list[dict]:
    """The rounds both ``arm`` and the target alone decoded more than one token in."""
    return [r for r in measured["rounds"] if r["tokens"][arm] > 1 and r["tokens"][TARGET_ONLY] > 1]


def _compare(rows: list[DecodeRow], rate: Rate, replayed: list[dict], arm: str) -> dict:
    """The ledger over ``rows`` at ``rate`` against the target-only replay of ``replayed``
    (the rows' speculative rounds; a held-out row's own difference is 0 by definition)."""
    total, _ = tally(rows, rate)
    replay_s = sum(decode_seconds(r, TARGET_ONLY) for r in replayed)
    measured_saved = replay_s - sum(decode_seconds(r, arm) for r in replayed)
    error = (abs(total.saved_s - measured_saved) / measured_saved
             if measured_saved > 0 else None)
    return {"arm": arm, "requests": total.requests, "tokens": total.tokens,
            "rate_tokens_per_s": rate.tokens_per_s, "rate_source": rate.source,
            "decode_s": total.decode_s, "ledger_baseline_s": total.baseline_s,
            "ledger_saved_s": total.saved_s, "replay_target_only_s": replay_s,
            "replay_saved_s": measured_saved, "relative_error": error,
            "tolerance": LEDGER_TOLERANCE,
            "reached": error is not None and error <= LEDGER_TOLERANCE}


def _arm(arm: str) -> str:
    if arm not in (GLOBAL, SEGMENT):
        raise ValueError(f"no arm {arm!r}: {GLOBAL} or {SEGMENT}")
    return arm


def ledger_check(measured: dict, picks: dict, arm: str = SEGMENT) -> dict:
    """The ledger of ``arm``'s decodes, R the gate's, against their target-only replay."""
    rounds = _timed(measured, _arm(arm))
    rate = Rate(tokens_per_s=gate_rate(picks), engine="native", concurrency=1,
                evaluations=[])
    return _compare([_row(r, arm) for r in rounds], rate, rounds, arm)


def holdout_check(measured: dict, arm: str = SEGMENT, every: int = HOLDOUT_EVERY) -> dict | None:
    """The ledger of a period where every ``every``-th request was held out (served by the
    target alone) and the rest by ``arm``, R the held-out requests' rate, against the
    target-only replay of the rest (module doc). None: too few requests to hold any out."""
    rounds = _timed(measured, _arm(arm))
    held = rounds[every - 1::every]
    served = [r for i, r in enumerate(rounds) if i % every != every - 1]
    if not held or not served:
        return None
    rows = [_row(r, TARGET_ONLY, holdout=True) for r in held] + [_row(r, arm) for r in served]
    rate = holdout_rate(rows, min_requests=1)
    assert rate is not None  # a held-out round decoded > 1 token in > 0 s
    return {**_compare(rows, rate, served, arm), "held_out": len(held), "every": every}


def ledger_text(check: dict | None) -> str:
    """The check in one line."""
    if check is None:
        return (f"ledger check with a holdout: too few requests to hold one in "
                f"{HOLDOUT_EVERY} out")
    n = check.get("held_out", 0)
    how = (f"R from {n} held-out request{'s' * (n != 1)}" if check["rate_source"] == "holdout"
           else "R the gate's")
    if check["relative_error"] is None:
        return (f"ledger check ({how}): speculation saved nothing measurable on the replay "
                f"({check['replay_saved_s']:.3f} s), so the ledger cannot be judged")
    return (f"ledger check ({how}; saved within {check['tolerance']:.0%} of a target-only "
            f"replay): {'reached' if check['reached'] else 'NOT reached'} — ledger "
            f"{check['ledger_saved_s']:.2f} s saved (R {check['rate_tokens_per_s']:.1f} "
            f"tokens/s) vs replay {check['replay_saved_s']:.2f} s "
            f"({check['relative_error']:.0%} off) over {check['requests'] - n} requests"
            + (f" ({n} more held out)" if n else ""))

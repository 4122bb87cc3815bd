"""The soak's figures, from what the load generator saw, what the store holds and what the
sampler measured: pure functions, no I/O.

- failures by kind, and which of them a fault explains (in flight when a replica was killed);
- p50 / p99 latency and τ per minute;
- responses naming a version that was not live (nor just moved from) at that moment;
- traffic rows against answered requests, matched by request number;
- resident memory per process per minute, and its growth after warm-up.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from autospec.bench.soak.load import FAILURE_KINDS, Outcome
from autospec.bench.soak.storeview import Row
from autospec.engine.stats import tau

BUILTIN = "builtin-ngram"


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def counts(outcomes: list[Outcome], kills: list[float]) -> dict[str, Any]:
    """Requests sent / answered / hung up on purpose / failed by kind. A failure in flight
    at a replica SIGKILL (sent before it, ended after it) is explained by the kill; a 503
    with ``Retry-After`` is declared overload — counted and named, not unexplained."""
    kinds = Counter(o.kind for o in outcomes)
    failed = [o for o in outcomes if o.kind in FAILURE_KINDS]
    explained = [o for o in failed if any(o.start <= k <= o.end for k in kills)]
    unexplained = [o for o in failed if o not in explained and o.kind != "overload_503"]
    latencies = [o.latency_s for o in outcomes if o.kind == "answered"]
    return {"sent": len(outcomes), "answered": kinds["answered"],
            "latency_p50_s": _round(percentile(latencies, 0.5)),
            "latency_p99_s": _round(percentile(latencies, 0.99)),
            "disconnected_on_purpose": kinds["disconnected"], "pending": kinds["pending"],
            "failed": len(failed), "failed_by_kind": {k: kinds[k] for k in FAILURE_KINDS},
            "failed_explained_by_replica_kill": len(explained),
            "failed_unexplained": len(unexplained),
            "unexplained_examples": [_brief(o) for o in unexplained[:10]],
            "overload_503_with_retry_after": kinds["overload_503"]}


def _brief(o: Outcome) -> dict[str, Any]:
    return {"n": o.n, "kind": o.kind, "status": o.status, "start": round(o.start, 2),
            "latency_s": round(o.latency_s, 2), "stream": o.stream, "error": o.error[:200]}


def per_minute(outcomes: list[Outcome], rows: list[Row], t0: float) -> list[dict[str, Any]]:
    """Each minute since ``t0``: requests answered, failed, p50 / p99 latency, τ of the rows."""
    lat: dict[int, list[float]] = defaultdict(list)
    failed: Counter[int] = Counter()
    for o in outcomes:
        minute = int((o.start - t0) // 60)
        if o.kind == "answered":
            lat[minute].append(o.latency_s)
        elif o.kind in FAILURE_KINDS:
            failed[minute] += 1
    steps: Counter[int] = Counter()
    accepted: Counter[int] = Counter()
    for r in rows:
        minute = int((r.at - t0) // 60)
        steps[minute] += r.drafts
        accepted[minute] += r.accepted
    last = max([*lat, *failed, *steps, 0])
    return [{"minute": m, "answered": len(lat[m]), "failed": failed[m],
             "p50_s": _round(percentile(lat[m], 0.5)), "p99_s": _round(percentile(lat[m], 0.99)),
             "tau": _round(tau(accepted[m], steps[m]))}
            for m in range(last + 1)]


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def allowed_timeline(moves: list[dict[str, Any]], refused: Iterable[str],
                     start: str | None = BUILTIN) -> list[tuple[float, str | None]]:
    """(from time, version the replicas may serve) after each move of one pointer: the
    version moved to, or — when replicas refused it — the one they kept; after an ``unpin``
    (a segment's own pointer dropped) None, nothing of its own. ``start``: what the pointer
    names before its first move (None: nothing of its own)."""
    refused = set(refused)
    timeline: list[tuple[float, str | None]] = [(-math.inf, start)]
    for move in sorted(moves, key=lambda m: m["at"]):
        if move.get("kind") == "unpin":
            timeline.append((move["at"], None))
            continue
        version = move["version"] or BUILTIN
        timeline.append((move["at"], timeline[-1][1] if version in refused else version))
    return timeline


Timeline = list[tuple[float, str | None]]


def allowed_timelines(moves: list[dict[str, Any]], refused: Iterable[str],
                      refused_by_segment: Mapping[str, Iterable[str]] | None = None
                      ) -> dict[str | None, Timeline]:
    """One timeline per live pointer: the deployment's (``None``, builtin-ngram before its
    first move) and each traffic segment's (a move whose ``details.segment`` names it; the
    segment falls back to the deployment's pointer until then). ``refused``: versions the
    replicas refused (for every pointer); ``refused_by_segment``: those they refused as one
    segment's version only (a vLLM replica refuses a segment version it cannot draft per
    request)."""
    refused, by_segment = set(refused), refused_by_segment or {}
    groups: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for move in moves:
        groups[(move.get("details") or {}).get("segment")].append(move)
    groups.setdefault(None, [])
    return {seg: allowed_timeline(ms, refused | set(by_segment.get(seg, ()) if seg else ()),
                                  BUILTIN if seg is None else None)
            for seg, ms in groups.items()}


def engine_starts(timeline: list[tuple[float, str | None]],
                  swaps: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(from, until, version): after a pointer move that a replica carried out by starting a
    second engine beside the first (a ``swap`` event with ``mode`` ``new engine``: vLLM, a
    change of kind or shape), the version before keeps serving until that engine is up —
    by design, not a stale version — so it stays allowed until the swap event."""
    spans = []
    for i in range(1, len(timeline)):
        at, version = timeline[i]
        before = timeline[i - 1][1]
        until = timeline[i + 1][0] if i + 1 < len(timeline) else math.inf
        done = [e["at"] for e in swaps if e.get("version") == version and at <= e["at"] < until
                and (e.get("details") or {}).get("mode") == "new engine"]
        if done and before != version:
            spans.append((at, min(done), before))
    return spans


def not_live(outcomes: list[Outcome], timelines: Mapping[str | None, Timeline],
             swap_grace_s: float,
             starts: Iterable[tuple[float, float, str]] = ()) -> list[dict[str, Any]]:
    """Answered requests whose ``x-autospec-speculator`` names a version allowed neither on
    the deployment's timeline (key ``None``) nor on their own segment's (the request's
    domain, the ``x-autospec-segment`` it sent: :func:`allowed_timelines`) at any moment
    from ``swap_grace_s`` before it was sent (replicas swap between requests, after their
    next poll) until its answer; ``starts``: :func:`engine_starts`. Another segment's
    version is never allowed: a request drafted by it is one served the wrong version. The
    deployment's stays allowed for every segment (a segment whose version the replicas
    refused, or not loaded yet, is drafted by it)."""
    starts = list(starts)
    bad = []
    for o in outcomes:
        if o.version is None:  # no answer named a version (an error before serving)
            continue
        lo = o.start - swap_grace_s
        ok: set[str | None] = set()
        for timeline in (timelines[None], timelines.get(o.domain)):
            if timeline is None:
                continue
            ok |= {v for t, v in timeline if lo < t <= o.end}
            ok.add(max((e for e in timeline if e[0] <= lo), key=lambda e: e[0])[1])
        ok |= {v for a, b, v in starts if a <= o.end and lo <= b}
        allowed = {v for v in ok if v is not None}  # None: a segment not (or no more) its own
        if o.version not in allowed:
            bad.append({"n": o.n, "version": o.version, "start": round(o.start, 2),
                        "segment": o.domain, "allowed": sorted(allowed)})
    return bad


#: a replica SIGKILL takes the rows still in its traffic writer's queue with it (the writer
#: commits every 50 ms; a kill gives it no chance to flush): a row missing for an answer that
#: ended this long before a kill (or just after, the kill seen late) is explained by it
ROW_LOSS_WINDOW_S = 2.0


def rows_vs_answers(outcomes: list[Outcome], rows: list[Row],
                    kills: Iterable[float] = ()) -> dict[str, Any]:
    """Traffic rows matched to requests by their number (the request's seed). An answer
    without a row that ended within :data:`ROW_LOSS_WINDOW_S` of a replica SIGKILL
    (``kills``) is counted as lost with the replica, the others as unexplained (the goal)."""
    kills = list(kills)
    by_n = {o.n: o for o in outcomes}
    seeds = Counter(r.seed for r in rows if r.seed is not None and r.seed in by_n)
    answered = {o.n for o in outcomes if o.kind == "answered"}
    missing = sorted(answered - set(seeds))
    lost = [n for n in missing if any(k - ROW_LOSS_WINDOW_S <= by_n[n].end <= k + 0.5
                                      for k in kills)]
    unexplained = [n for n in missing if n not in lost]
    extra = Counter(by_n[n].kind for n in seeds if n not in answered)
    wrong_version = sum(1 for r in rows if r.seed in answered and by_n[r.seed].version
                        and r.version != by_n[r.seed].version)
    return {"rows": sum(seeds.values()), "answered": len(answered),
            "answered_without_row": len(unexplained), "missing_examples": unexplained[:20],
            "row_lost_at_replica_kill": len(lost), "lost_examples": lost[:20],
            "rows_without_answer_by_client_outcome": dict(extra),
            "duplicate_rows": sum(c - 1 for c in seeds.values() if c > 1),
            "row_version_differs_from_header": wrong_version,
            "other_rows": sum(1 for r in rows if r.seed is None or r.seed not in by_n)}


def memory(samples: list[tuple[float, str, int]], t0: float, warmup_s: float,
           warm_from: dict[str, float] | None = None,
           judged_until: dict[str, float] | None = None,
           busy: dict[str, list[tuple[float, float]]] | None = None) -> dict[str, Any]:
    """Per process: RSS (MiB) per minute (the largest sample), and the growth of its floor
    after warm-up: the lowest minute of the last third against the lowest of the first
    third, counted from the run's warm-up or the process's own (a process started late, a
    restarted replica, warms up too), for a process named in ``warm_from`` not before that
    time (a controller loads its target at its first cycle and keeps it: its warm-up ends
    with that cycle), and for one named in ``judged_until`` not after that time (a
    controller killed inside a cycle: what it held then was the cycle's, not a floor), and
    leaving out a process's samples inside its ``busy`` spans (a controller's cycles: the
    rule is after its floor between them, and a minute that is all cycle has none). A leak
    raises the floor; a saw-tooth does not."""
    warm_from, judged_until, busy = warm_from or {}, judged_until or {}, busy or {}
    per: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    idle: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for t, name, rss in samples:
        per[name][int((t - t0) // 60)].append(rss)
        if not any(start <= t <= end for start, end in busy.get(name, ())):
            idle[name][int((t - t0) // 60)].append(rss)
    out: dict[str, Any] = {}
    warm = math.ceil(warmup_s / 60)
    for name, minutes in sorted(per.items()):
        mib = {m: max(v) / 2**20 for m, v in sorted(minutes.items())}
        floor = {m: max(v) / 2**20 for m, v in sorted(idle[name].items())}
        own = math.ceil((warm_from[name] - t0) / 60) if name in warm_from else 0
        until = int((judged_until[name] - t0) // 60) if name in judged_until else None
        after = [floor[m] for m in floor if m >= max(warm, min(mib) + warm, own)
                 and (until is None or m <= until)]
        growth = None
        if len(after) >= 3:
            third = len(after) // 3
            first, last = min(after[:third]), min(after[-third:])
            growth = round((last - first) / first * 100, 1) if first else None
        out[name] = {"rss_mib_per_minute": {str(m): round(v, 1) for m, v in mib.items()},
                     "growth_after_warmup_pct": growth}
        if until is not None:
            out[name]["judged_until_minute"] = until
        if busy.get(name):  # what was judged: each minute's samples outside the cycles
            out[name]["between_cycles_mib_per_minute"] = {str(m): round(v, 1)
                                                          for m, v in floor.items()}
    return out

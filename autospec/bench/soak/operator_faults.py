"""The operator's faults: moves an operator makes by hand while the controller runs
(``autospec promote`` / ``rollback``, of the deployment and of a segment), each judged by
whether the served responses follow the moves."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

from autospec.bench.soak import procs
from autospec.bench.soak.fault_context import FaultContext, FaultRecord, wait_until
from autospec.bench.soak.storeview import StoreView

#: traffic time an operator promotion + rollback needs to be observed: two CLI runs (each
#: imports the package, seconds on a small machine) and a replica poll after each
OPERATOR_WINDOW_S = 60.0


def operator_promote_rollback(ctx: FaultContext) -> FaultRecord:
    """While the controller runs: ``autospec promote V --force`` of a registered version that
    is not live, then ``autospec rollback``. Recovery: from the rollback until a response
    names the version the pointer names after it (the one live before, unless the controller
    moved the pointer meanwhile: then the one it moved to). ok: both commands succeed and
    responses follow both moves."""
    rec = FaultRecord("operator promotion and rollback")
    if (left := ctx.deadline - time.time()) < OPERATOR_WINDOW_S:
        rec.skipped = (f"{left:.0f} s of traffic left, fewer than the {OPERATOR_WINDOW_S:.0f} s "
                       f"two operator commands and two swaps need to be seen")
        return rec
    live = ctx.view.live()
    pick = wait_until(lambda: [v for v in ctx.view.versions() if v["version"] != live
                               and not v["version"].startswith("soak-")
                               and v["state"] not in ("pruned",)], ctx.deadline, 2.0)
    if not pick:
        rec.skipped = "no registered version other than the live one"
        return rec
    real = [v for v in pick if v["version"] != "builtin-ngram"]
    version = (real or pick)[-1]["version"]
    rec.at = time.time()
    got = procs.run_cli(["promote", version, "--force", "--reason", "soak: operator promotion"],
                        env=ctx.env)
    rec.detail.append(f"promote {version}: exit {got.returncode} {got.stderr.strip()[-200:]}")
    def live_now() -> str:
        return ctx.view.live() or "builtin-ngram"
    served = _follows(ctx, live_now, rec.at)
    rec.detail.append(_seen("served", served, rec.at))
    rolled = time.time()
    back = procs.run_cli(["rollback", "--reason", "soak: operator rollback"], env=ctx.env)
    rec.detail.append(f"rollback to {ctx.view.live()}: exit {back.returncode}")
    again = _follows(ctx, live_now, rolled)
    rec.detail.append(_seen("served after the rollback", again, rolled))
    rec.recovery_s = None if again is None else again[0] - rolled
    rec.ok = got.returncode == 0 and _rolled_back(back, rec) and bool(served) and bool(again)
    return rec


def _follows(ctx: FaultContext, pointer: Callable[[], str], t: float,
             segment: str | None = None) -> tuple[float, str] | None:
    """When a response (of ``segment``, if given) sent after ``t`` was first drafted by a
    version ``pointer()`` named since ``t``, and which: (epoch seconds, version), or None
    within 120 s. The pointer is read at each poll, so a move the controller makes
    meanwhile is followed too: the replicas serve what the pointer names, whoever moved it."""
    named: set[str] = set()

    def found() -> tuple[float, str] | None:
        named.add(pointer())
        done = [(o.end, o.version) for o in ctx.load.snapshot()
                if o.start > t and o.kind == "answered" and o.version in named
                and segment in (None, o.domain)]
        return min(done) if done else None
    return wait_until(found, min(ctx.deadline, time.time() + 120.0))


def _seen(what: str, got: tuple[float, str] | None, t: float) -> str:
    if got is None:
        return f"{what}: never"
    return f"{what}: {got[1]} after {got[0] - t:.1f}s"


#: traffic time an operator's segment promotion + unpin needs to be observed: two CLI runs
#: and a request of the segment after each (the load's busiest segment: one every few seconds)
SEGMENT_WINDOW_S = 40.0


def operator_segment_promote_rollback(ctx: FaultContext) -> FaultRecord:
    """While the controller runs: ``autospec promote V --segment S --force`` of a registered
    version that does not draft S now, then ``autospec rollback --segment S`` (``--unpin``
    when S had no pointer of its own before). S is the segment the load sent most requests
    of in the last minute; V is of the deployment's version's kind where one is registered
    (on vLLM a segment's own version must be: docs/segments.md). Recovery: from the rollback
    until a response of S names a version that drafts S after it (the one before, or, when
    the controller moves the deployment's pointer meanwhile, the one it moves to: read at
    each poll, as the replicas do). ok: both commands succeed and
    S's responses follow both moves; or, where the CLI refuses the move (exit 3, saying
    why: the replicas cannot draft S with V, or the controller made V the deployment's
    version meanwhile, so S already follows it), S's own pointer unmoved."""
    rec = FaultRecord("operator promotion and rollback of a segment")
    if (left := ctx.deadline - time.time()) < SEGMENT_WINDOW_S:
        rec.skipped = (f"{left:.0f} s of traffic left, fewer than the {SEGMENT_WINDOW_S:.0f} s "
                       f"two operator commands and two segment swaps need to be seen")
        return rec
    segment = _busiest_segment(ctx)
    before = ctx.view.serving(segment)
    pick = wait_until(lambda: _segment_pick(ctx.view, before), ctx.deadline, 2.0)
    if not pick:
        rec.skipped = f"no registered version other than {before}, which drafts {segment}"
        return rec
    own = ctx.view.live(segment)  # S's own pointer (None: S follows the deployment's)
    had_own = own is not None
    rec.at = time.time()
    got = procs.run_cli(["promote", pick, "--segment", segment, "--force",
                         "--reason", "soak: operator segment promotion"], env=ctx.env)
    rec.detail.append(f"promote {pick} --segment {segment}: exit {got.returncode} "
                      f"{got.stderr.strip()[-300:]}")
    if got.returncode == 3:  # refused: the replicas could not draft the segment with it, or
        # the controller's cycle made V the deployment's version meanwhile (S follows it)
        rec.ok = ctx.view.live(segment) == own and "segment" in got.stderr
        rec.recovery_s = time.time() - rec.at
        return rec
    drafts = partial(ctx.view.serving, segment)
    served = _follows(ctx, drafts, rec.at, segment)
    rec.detail.append(_seen(f"served on {segment}", served, rec.at))
    rolled = time.time()
    back = procs.run_cli(["rollback", "--segment", segment, *([] if had_own else ["--unpin"]),
                          "--reason", "soak: operator segment rollback"], env=ctx.env)
    rec.detail.append(f"rollback --segment {segment}{'' if had_own else ' --unpin'}: exit "
                      f"{back.returncode}; {segment} drafted by {drafts()} (before: {before})")
    again = _follows(ctx, drafts, rolled, segment)
    rec.detail.append(_seen(f"served on {segment} after the rollback", again, rolled))
    rec.recovery_s = None if again is None else again[0] - rolled
    rec.ok = got.returncode == 0 and _rolled_back(back, rec) and bool(served) and bool(again)
    return rec


def _rolled_back(back: subprocess.CompletedProcess[str], rec: FaultRecord) -> bool:
    """The operator's rollback moved the pointer back — or was refused because the canary had
    rolled the promotion back already (a second rollback would undo the canary's)."""
    if back.returncode == 3 and "the canary rolled" in back.stderr:
        rec.detail.append("the canary had rolled the promotion back first: "
                          + back.stderr.strip()[-200:])
        return True
    return back.returncode == 0


def _busiest_segment(ctx: FaultContext) -> str:
    recent = Counter(o.domain for o in ctx.load.snapshot() if o.start > time.time() - 60.0)
    return recent.most_common(1)[0][0] if recent else "support"


def _segment_pick(view: StoreView, drafting: str | None) -> str | None:
    """A registered version to put on a segment now drafted by ``drafting``: of its kind
    where one is, the newest."""
    registered = view.versions()
    versions = [v for v in registered if v["version"] not in (drafting, "builtin-ngram")
                and not v["version"].startswith("soak-") and v["state"] != "pruned"
                and v["artifact_uri"]]
    kind = next((v["kind"] for v in registered if v["version"] == drafting), None)
    same = [v for v in versions if v["kind"] == kind]
    return (same or versions)[-1]["version"] if versions else None

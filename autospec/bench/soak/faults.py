"""The faults a soak injects, each a small function of a :class:`FaultContext` that returns
its :class:`FaultRecord`: when it struck, what was seen, and how long until the system was
whole again (``recovery_s``, defined per fault in its docstring). A fault whose moment never
came (no training started before its deadline, no version to corrupt) is ``skipped``, with
the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from autospec import store
from autospec.bench.soak import procs
from autospec.bench.soak.load import LoadGenerator
from autospec.bench.soak.storeview import StoreView, cycles, refusals


@dataclass
class FaultRecord:
    """One injected fault."""

    name: str
    at: float = 0.0
    recovery_s: float | None = None
    ok: bool | None = None
    skipped: str = ""
    detail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FaultContext:
    """What a fault may touch: the serve and controller processes, the load, the store."""

    base_url: str
    env: dict[str, str]
    logs: Path
    serve: procs.Child
    load: LoadGenerator
    view: StoreView
    data_dir: Path
    db_path: Path | None
    start_controller: Callable[[], procs.Child]
    controller: procs.Child | None = None
    say: Callable[[str], None] = print
    deadline: float = float("inf")


def wait_until(predicate: Callable[[], Any], deadline: float, step_s: float = 0.5) -> Any:
    """``predicate()``'s first truthy value, or None at ``deadline`` (epoch seconds)."""
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(step_s)
    return None


def first_answer_after(ctx: FaultContext, t: float, deadline: float) -> float | None:
    """Epoch time of the first request sent after ``t`` that was answered."""
    def found() -> float | None:
        done = [o.end for o in ctx.load.snapshot() if o.start > t and o.kind == "answered"]
        return min(done) if done else None
    return wait_until(found, deadline)


def replica_sigkill(ctx: FaultContext) -> FaultRecord:
    """SIGKILL a Ray Serve replica while a request is in flight; Ray restarts it. Recovery:
    until the first request sent after the kill is answered."""
    rec = FaultRecord("replica SIGKILL mid-request")
    if not wait_until(lambda: ctx.load.in_flight() > 0, ctx.deadline, 0.05):
        rec.skipped = "no request in flight before the deadline"
        return rec
    pids = procs.replica_pids(ctx.serve.pid)
    if not pids:
        rec.skipped = "no replica process found below autospec serve"
        return rec
    rec.at = time.time()
    os.kill(pids[0], signal.SIGKILL)
    rec.detail.append(f"killed replica pid {pids[0]} with {ctx.load.in_flight()} in flight")
    back = first_answer_after(ctx, rec.at, ctx.deadline)
    new = procs.replica_pids(ctx.serve.pid)
    rec.detail.append(f"replica pids after: {new}")
    rec.ok = back is not None and bool(new) and pids[0] not in new
    rec.recovery_s = None if back is None else back - rec.at
    return rec


def controller_sigkill(ctx: FaultContext, *, when: str) -> FaultRecord:
    """SIGKILL the controller ``when`` = ``training`` (a training run is running) or ``gated``
    (an evaluation of the cycle running passed the gate, its candidate not promoted yet),
    then start another. Recovery: until the new controller records the interrupted cycle
    (a ``failure`` event of type ``cycle``); ok when it did and no version of the killed
    cycle went live without its cycle record."""
    moment = "in training" if when == "training" else "right after the gate passed"
    rec = FaultRecord(f"controller SIGKILL ({moment})")
    since = time.time()
    ready = ((lambda: ctx.view.training_running_since(since)) if when == "training"
             else ctx.view.gate_passed_pending)
    hit = wait_until(ready, ctx.deadline, 0.1)
    if not hit or ctx.controller is None:
        rec.skipped = f"the controller was not {when} before the deadline"
        return rec
    before = ctx.view.last_event_id()
    rec.at = time.time()
    ctx.controller.popen.send_signal(signal.SIGKILL)
    ctx.controller.popen.wait()
    rec.detail.append(f"killed controller pid {ctx.controller.pid}"
                      + (f" after the gate passed {hit}" if when == "gated" else ""))
    ctx.controller = ctx.start_controller()

    def closed() -> dict[str, Any] | None:
        got = [e for e in ctx.view.events(before)
               if e["kind"] == "failure" and e["details"].get("type") == "cycle"]
        return got[0] if got else None
    event = wait_until(closed, ctx.deadline, 1.0)
    if event is not None:
        rec.recovery_s = event["at"] - rec.at
        rec.detail.append(f"recorded: {event['reason']}")
    later = ctx.view.events(before)
    half = [e["version"] for e in later if e["kind"] == "promotion"
            and not e["reason"].startswith("soak") and not _has_cycle_record(later, e["version"])]
    if half:
        rec.detail.append(f"promoted without a cycle record: {half}")
    rec.ok = event is not None and not half
    return rec


def _has_cycle_record(events: list[dict[str, Any]], version: str | None) -> bool:
    return any(c["promoted"] == version for c in cycles(events))


#: the kinds trained by gradient: their runs last long enough to time a lock on their end
GRADIENT_KINDS = ("eagle3", "draft")


def database_locked(ctx: FaultContext, *, hold_s: float = 60.0,
                    at_registration: float = 0.0) -> FaultRecord:
    """Hold an exclusive write lock on the SQLite file for ``hold_s`` while traffic flows
    (replicas spill rows, a cycle cannot write). With ``at_registration``, timed so a cycle
    tries to register a version meanwhile: once a gradient run is training, the lock is
    taken ``hold_s / 2`` before that run's kind usually ends (the median of its earlier
    runs); ok then also needs the run closed after the release (registered, or failed with
    its reason) and no artifact directory without its version. Recovery: from the release
    until a traffic row written after it appears."""
    rec = FaultRecord(f"database locked {hold_s:.0f}s"
                      + (" at a registration" if at_registration else ""))
    if ctx.db_path is None:
        rec.skipped = "not a SQLite store"
        return rec
    run = _time_for_registration(ctx, rec, hold_s) if at_registration else None
    if rec.skipped:
        return rec
    conn = sqlite3.connect(ctx.db_path, timeout=30.0, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        rec.at = time.time()
        time.sleep(hold_s)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    released = time.time()
    meanwhile = sum(1 for o in ctx.load.snapshot()
                    if rec.at <= o.end <= released and o.kind == "answered")
    rec.detail.append(f"held {released - rec.at:.0f}s; answered meanwhile: {meanwhile}")
    row = wait_until(lambda: any(r.at >= released for r in ctx.view.rows()), ctx.deadline, 1.0)
    rec.recovery_s = time.time() - released if row else None
    rec.ok = bool(row) and (run is None or _registration_after(ctx, rec, run, released))
    return rec


def _time_for_registration(ctx: FaultContext, rec: FaultRecord, hold_s: float) -> Any:
    """Wait for a gradient run, then until ``hold_s / 2`` before its kind usually ends; the
    run (None, with ``rec.skipped`` set, when none trained before the deadline)."""
    since = time.time()
    run = wait_until(lambda: ctx.view.running_run(since, GRADIENT_KINDS), ctx.deadline, 0.5)
    if run is None:
        rec.skipped = "no training run started before the deadline"
        return None
    took = ctx.view.typical_training_s(run.kind)
    if took is not None:
        time.sleep(max(0.0, min(run.started + took - hold_s / 2, ctx.deadline) - time.time()))
    rec.detail.append(f"timed on run {run.id} ({run.kind}; its kind took "
                      f"{'?' if took is None else f'{took:.0f}s'} before)")
    return run


def _registration_after(ctx: FaultContext, rec: FaultRecord, run: Any,
                        released: float) -> bool:
    """The timed run ended after the release with a verdict, nothing half-registered."""
    ended = wait_until(lambda: (r := ctx.view.run(run.id)).status != "running" and r,
                       ctx.deadline, 1.0)
    root, known = ctx.data_dir / "artifacts", {v["version"] for v in ctx.view.versions()}
    orphans = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in known) \
        if root.is_dir() else []  # a .partial-* directory left behind counts too
    if not ended:
        rec.detail.append(f"run {run.id} still running at the deadline")
        return False
    when = "" if ended.finished is None else f" {ended.finished - released:+.0f}s from the release"
    rec.detail.append(f"run {run.id}: {ended.status}{when}"
                      + (f", registered {ended.version}" if ended.version else "")
                      + (f" ({ended.error})" if ended.error else "")
                      + (f"; artifacts without a version: {orphans}" if orphans else ""))
    return not orphans and (ended.status == "succeeded" or bool(ended.error))


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[str]:
    """``directory`` read-only while inside: chmod 0555, and for root (whom modes do not
    stop) the immutable attribute too (``chattr +i``); yields how."""
    mode = directory.stat().st_mode
    directory.chmod(0o555)
    how = "chmod 0555"
    immutable = os.geteuid() == 0 and shutil.which("chattr") is not None
    if immutable:
        immutable = subprocess.run(["chattr", "+i", str(directory)], check=False,
                                   capture_output=True).returncode == 0
        how += " + chattr +i" if immutable else " (root: chattr +i refused, so not enforced)"
    try:
        yield how
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=False)
        directory.chmod(mode)


def artifacts_read_only(ctx: FaultContext) -> FaultRecord:
    """The artifact directory read-only from the moment a training run starts until its cycle
    ends. ok: that cycle failed with a reason (nothing half-registered) and the controller
    lives on. Recovery: from restoring the directory to the next cycle record."""
    rec = FaultRecord("artifact dir read-only while a candidate is saved")
    since = time.time()
    directory = ctx.data_dir / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    if not wait_until(lambda: ctx.view.training_running_since(since), ctx.deadline, 0.1):
        rec.skipped = "no training started before the deadline"
        return rec
    before = ctx.view.last_event_id()
    with read_only(directory) as how:
        rec.at = time.time()
        rec.detail.append(how)
        ended = wait_until(lambda: cycles(ctx.view.events(before)), ctx.deadline, 1.0)
    restored = time.time()
    if not ended:
        rec.skipped = "the cycle did not end before the deadline"
        return rec
    rec.detail.append(f"that cycle: {ended[0]['outcome']} — {'; '.join(ended[0]['reasons'])[:400]}")
    rec.ok = (ended[0]["outcome"] != "promoted"
              and ctx.controller is not None and ctx.controller.alive())
    rec.recovery_s = restored - rec.at
    return rec


def bad_version(ctx: FaultContext) -> FaultRecord:
    """A copy of a registered version's artifact, registered, then corrupted on disk, pointed
    live by an operator (``autospec promote --force``). ok: replicas refuse it and say why
    (a ``failure`` event) and go on serving the version before; then ``autospec rollback``.
    Recovery: from the promotion to the replicas' refusal."""
    rec = FaultRecord("corrupt version pointed live by hand")
    source = wait_until(lambda: _artifact_version(ctx.view), ctx.deadline, 2.0)
    if source is None:
        rec.skipped = "no registered version with an artifact to copy"
        return rec
    name = f"soak-corrupt-{int(time.time())}"
    copy = ctx.data_dir / "artifacts" / name
    shutil.copytree(source["artifact_uri"], copy)
    with store.session_scope(ctx.view.engine) as session:
        store.register_speculator(session, version=name, kind=source["kind"],
                                  target_id=source["target_id"],
                                  target_revision=source["target_revision"],
                                  artifact_uri=str(copy), sha256=source["sha256"], actor="soak")
    _corrupt(copy)
    before, served_before = ctx.view.last_event_id(), ctx.view.live()
    rec.at = time.time()
    got = procs.run_cli(["promote", name, "--force", "--reason", "soak: a corrupt artifact"],
                        env=ctx.env)
    rec.detail.append(f"promote {name} (a corrupt copy of {source['version']}): "
                      f"exit {got.returncode}")
    refused = wait_until(lambda: [e for e in refusals(ctx.view.events(before))
                                  if e["version"] == name], ctx.deadline, 0.5)
    if refused:
        rec.recovery_s = refused[0]["at"] - rec.at
        rec.detail.append(f"replica said: {refused[0]['reason'][:300]}")
    back = procs.run_cli(["rollback", "--reason", "soak: undo the corrupt version"], env=ctx.env)
    rec.detail.append(f"rollback: exit {back.returncode}; live again: {ctx.view.live()} "
                      f"(before: {served_before})")
    rec.ok = bool(refused) and got.returncode == 0 and back.returncode == 0
    return rec


def _artifact_version(view: StoreView) -> dict[str, Any] | None:
    found = [v for v in view.versions() if v["artifact_uri"] and
             not v["version"].startswith("soak-") and Path(v["artifact_uri"]).is_dir()]
    return found[-1] if found else None


def _corrupt(directory: Path) -> None:
    """Flip one byte in the largest file (bit rot after registration)."""
    victim = max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))


#: traffic time an operator promotion + rollback needs to be observed: two CLI runs (each
#: imports the package, seconds on a small machine) and a replica poll after each
OPERATOR_WINDOW_S = 60.0


def operator_promote_rollback(ctx: FaultContext) -> FaultRecord:
    """While the controller runs: ``autospec promote V --force`` of a registered version that
    is not live, then ``autospec rollback``. Recovery: from the rollback until a response
    names the version live before. ok: both commands succeed and responses follow both moves."""
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
    served = _served_after(ctx, version, rec.at)
    rec.detail.append(f"served {version}: "
                      + (f"after {served - rec.at:.1f}s" if served else "never"))
    rolled = time.time()
    back = procs.run_cli(["rollback", "--reason", "soak: operator rollback"], env=ctx.env)
    previous = ctx.view.live()
    rec.detail.append(f"rollback to {previous}: exit {back.returncode}")
    again = _served_after(ctx, previous or "builtin-ngram", rolled)
    rec.recovery_s = None if again is None else again - rolled
    rec.ok = got.returncode == 0 and back.returncode == 0 and bool(served) and bool(again)
    return rec


def _served_after(ctx: FaultContext, version: str, t: float,
                  segment: str | None = None) -> float | None:
    def found() -> float | None:
        done = [o.end for o in ctx.load.snapshot()
                if o.start > t and o.kind == "answered" and o.version == version
                and segment in (None, o.domain)]
        return min(done) if done else None
    return wait_until(found, min(ctx.deadline, time.time() + 120.0))


#: traffic time an operator's segment promotion + unpin needs to be observed: two CLI runs
#: and a request of the segment after each (the load's busiest segment: one every few seconds)
SEGMENT_WINDOW_S = 40.0


def operator_segment_promote_rollback(ctx: FaultContext) -> FaultRecord:
    """While the controller runs: ``autospec promote V --segment S --force`` of a registered
    version that does not draft S now, then ``autospec rollback --segment S`` (``--unpin``
    when S had no pointer of its own before). S is the segment the load sent most requests
    of in the last minute; V is of the deployment's version's kind where one is registered
    (on vLLM a segment's own version must be: docs/segments.md). Recovery: from the rollback
    until a response of S names the version that drafts S after it (the one before, unless
    the controller moved the deployment's pointer meanwhile). ok: both commands succeed and
    S's responses follow both moves; or, where the replicas cannot draft S with V (the
    CLI says why, exit 3), the refusal, with S's pointer unmoved."""
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
    had_own = ctx.view.live(segment) is not None
    rec.at = time.time()
    got = procs.run_cli(["promote", pick, "--segment", segment, "--force",
                         "--reason", "soak: operator segment promotion"], env=ctx.env)
    rec.detail.append(f"promote {pick} --segment {segment}: exit {got.returncode} "
                      f"{got.stderr.strip()[-300:]}")
    if got.returncode == 3:  # refused: the replicas could not draft the segment with it
        rec.ok = ctx.view.serving(segment) == before and "segment" in got.stderr
        rec.recovery_s = time.time() - rec.at
        return rec
    served = _served_after(ctx, pick, rec.at, segment)
    rec.detail.append(f"served {pick} on {segment}: "
                      + (f"after {served - rec.at:.1f}s" if served else "never"))
    rolled = time.time()
    back = procs.run_cli(["rollback", "--segment", segment, *([] if had_own else ["--unpin"]),
                          "--reason", "soak: operator segment rollback"], env=ctx.env)
    now = ctx.view.serving(segment)
    rec.detail.append(f"rollback --segment {segment}{'' if had_own else ' --unpin'}: exit "
                      f"{back.returncode}; {segment} drafted by {now} (before: {before})")
    again = _served_after(ctx, now, rolled, segment)
    rec.recovery_s = None if again is None else again - rolled
    rec.ok = got.returncode == 0 and back.returncode == 0 and bool(served) and bool(again)
    return rec


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


#: the faults by name (``--faults`` and the schedule name them)
FAULTS: dict[str, Callable[..., FaultRecord]] = {
    "replica_sigkill": replica_sigkill,
    "controller_sigkill_training": partial(controller_sigkill, when="training"),
    "db_locked": database_locked,
    "artifacts_read_only": artifacts_read_only,
    "bad_version": bad_version,
    "operator_promote_rollback": operator_promote_rollback,
    "operator_segment_promote_rollback": operator_segment_promote_rollback,
    "controller_sigkill_gated": partial(controller_sigkill, when="gated"),
}

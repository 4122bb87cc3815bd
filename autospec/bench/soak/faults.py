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
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from autospec import store
from autospec.bench.soak import procs
from autospec.bench.soak.fault_context import (
    FaultContext,
    FaultRecord,
    first_answer_after,
    wait_until,
)
from autospec.bench.soak.operator_faults import (
    operator_promote_rollback,
    operator_segment_promote_rollback,
)
from autospec.bench.soak.storeview import StoreView, cycles, refusals


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


#: traffic time a SIGKILLed controller's successor needs to record the dead cycle: its start
#: (imports, seconds on a small machine), the dead holder's lease (the soak policy's 30 s) and
#: a watch interval (10 s), with room for a loaded machine
CONTROLLER_RECOVERY_S = 75.0


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
    hit = wait_until(ready, ctx.deadline - CONTROLLER_RECOVERY_S, 0.1)
    if not hit or ctx.controller is None:
        rec.skipped = (f"the controller was not {when} {CONTROLLER_RECOVERY_S:.0f} s before "
                       f"the deadline (the time a new controller needs to close the cycle)")
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
    ends. ok: no version was registered while it was read-only (nothing half-registered:
    the run that could not save failed with its reason) and the controller lives on. The
    cycle may still promote a kind it saved before the directory turned read-only (its kinds
    train in turn, and one that fails is skipped). Recovery: from restoring the directory to
    the next cycle record."""
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
    saved = [v["version"] for v in ctx.view.versions() if rec.at <= v["registered_at"] <= restored]
    if saved:
        rec.detail.append(f"registered while read-only: {saved}")
    rec.ok = not saved and ctx.controller is not None and ctx.controller.alive()
    rec.recovery_s = restored - rec.at
    return rec


def bad_version(ctx: FaultContext) -> FaultRecord:
    """A copy of a registered version's artifact, registered, then corrupted on disk, pointed
    live by hand. ``autospec promote --force`` refuses it (exit 3: it reads the artifact), so
    it is pointed live as an operator CLI where the shared storage is not mounted would (the
    store's ``set_live``, an override). ok: promote refused it, the replicas refuse it and
    say why (a ``failure`` event) and go on serving the version before; then ``autospec
    rollback``. Recovery: from the pointer's move to the replicas' refusal."""
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
    got = procs.run_cli(["promote", name, "--force", "--reason", "soak: a corrupt artifact"],
                        env=ctx.env)
    rec.detail.append(f"promote {name} (a corrupt copy of {source['version']}): "
                      f"exit {got.returncode} (3: refused)")
    rec.at = time.time()
    with store.session_scope(ctx.view.engine) as session:  # where promote cannot read it
        store.set_live(session, version=name, actor="soak", kind="override",
                       reason="soak: a corrupt artifact, pointed live unchecked")
    refused = wait_until(lambda: [e for e in refusals(ctx.view.events(before))
                                  if e["version"] == name], ctx.deadline, 0.5)
    if refused:
        rec.recovery_s = refused[0]["at"] - rec.at
        rec.detail.append(f"replica said: {refused[0]['reason'][:300]}")
    back = procs.run_cli(["rollback", "--reason", "soak: undo the corrupt version"], env=ctx.env)
    rec.detail.append(f"rollback: exit {back.returncode}; live again: {ctx.view.live()} "
                      f"(before: {served_before})")
    rec.ok = bool(refused) and got.returncode == 3 and back.returncode == 0
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

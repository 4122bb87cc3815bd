"""The operator faults judge whether responses follow the pointer, whoever moves it: the
stop-52 CI case, where the controller promoted a new version seconds after the operator's
``rollback --segment json --unpin``, so json's responses never named the version read just
after the rollback, and the fault failed on a healthy deployment."""

from __future__ import annotations

import subprocess
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from autospec.bench.soak import operator_faults
from autospec.bench.soak.load import Outcome


class _Pointers:
    """The store as the fault reads it: the deployment's pointer and json's own."""

    def __init__(self) -> None:
        self.deployment = "eagle3-0001"
        self.json: str | None = None
        self.stale: tuple[str, float] | None = None  # what the fault reads, until when

    def live(self, segment: str | None = None) -> str | None:
        return self.json if segment == "json" else self.deployment

    def serving(self, segment: str) -> str:
        if self.stale and time.time() < self.stale[1]:
            return self.stale[0]
        return self.current()

    def current(self) -> str:
        """What the replicas draft json with."""
        return self.json or self.deployment

    def versions(self) -> list[dict[str, Any]]:
        return [{"version": v, "kind": "eagle3", "state": "registered",
                 "artifact_uri": f"/a/{v}"} for v in ("eagle3-0001", "eagle3-0002")]


class _Replicas:
    """Answers a json request every 50 ms, drafted by what json's pointer named when it
    was sent."""

    def __init__(self, view: _Pointers) -> None:
        self.view, self.outcomes, self.stop = view, [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            drafting, start = self.view.current(), time.time()
            time.sleep(0.05)
            self.outcomes.append(Outcome(n=len(self.outcomes), domain="json", stream=False,
                                         hang_up=False, start=start, end=time.time(),
                                         kind="answered", version=drafting))

    def snapshot(self) -> list[Outcome]:
        return list(self.outcomes)


def _operator(view: _Pointers, controller_promotes: str | None):
    def run_cli(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        if args[0] == "promote":
            view.json = args[1]
        elif args[0] == "rollback":
            view.json = None
            if controller_promotes:  # the controller's cycle lands as the unpin does: the
                # fault's reads in the next 0.3 s still see the deployment's pointer before it
                view.stale = (view.deployment, time.time() + 0.3)
                view.deployment = controller_promotes
        return subprocess.CompletedProcess(args, 0, "", "")
    return run_cli


def _segment_fault(view: _Pointers, replicas: _Replicas, run_cli: Any, seconds: float) -> Any:
    """The segment operator fault run against ``replicas`` (answering json requests as they
    go), with ``run_cli`` for the CLI, ``seconds`` of traffic left."""
    replicas.thread.start()
    time.sleep(0.2)
    ctx = SimpleNamespace(view=view, load=replicas, env={}, deadline=time.time() + seconds)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(operator_faults, "SEGMENT_WINDOW_S", 1.0)
            mp.setattr(operator_faults.procs, "run_cli", run_cli)
            return operator_faults.operator_segment_promote_rollback(ctx)  # type: ignore[arg-type]
    finally:
        replicas.stop.set()


@pytest.mark.parametrize("controller_promotes", [None, "suffix-0003"])
def test_a_segment_unpin_is_followed_even_when_the_controller_moves_the_deployment(
        controller_promotes: str | None) -> None:
    view = _Pointers()
    rec = _segment_fault(view, _Replicas(view), _operator(view, controller_promotes), 10)
    assert rec.ok, rec.detail
    after = rec.detail[-1]
    assert after.startswith("served on json after the rollback: "
                            + (controller_promotes or "eagle3-0001")), rec.detail
    assert "served on json: eagle3-0002" in rec.detail[1]


def test_a_segment_whose_responses_never_follow_the_move_fails() -> None:
    """The check can fail: replicas that keep drafting json with the old version after the
    operator's promotion are not ok."""
    view = _Pointers()
    stuck = SimpleNamespace(current=lambda: "eagle3-0001")

    def run_cli(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        view.json = args[1] if args[0] == "promote" else None
        return subprocess.CompletedProcess(args, 0, "", "")
    rec = _segment_fault(view, _Replicas(stuck), run_cli, 2)  # type: ignore[arg-type]
    assert not rec.ok and "served on json: never" in rec.detail[1], rec.detail


def test_a_rollback_refused_because_the_canary_rolled_back_first_counts_as_rolled_back() -> None:
    from autospec.bench.soak.fault_context import FaultRecord

    rec = FaultRecord("x")
    canary = subprocess.CompletedProcess([], 3, "", "refused: the canary rolled deployment "
                                         "default back from v2 to v1 (...); pass --force")
    assert operator_faults._rolled_back(canary, rec) and "canary" in rec.detail[-1]
    other = subprocess.CompletedProcess([], 3, "", "refused: nothing to roll back")
    assert not operator_faults._rolled_back(other, FaultRecord("y"))
    assert operator_faults._rolled_back(subprocess.CompletedProcess([], 0, "", ""), rec)


@pytest.mark.parametrize("json_moved", [False, True])
def test_a_segment_promotion_refused_as_the_controller_promotes_that_version_is_ok(
        json_moved: bool) -> None:
    """CI (this session's slow run): between the fault's pick and its ``promote V --segment
    json``, the controller made V the deployment's version, so json already followed it and
    the CLI refused (exit 3). json's own pointer did not move: ok. Had it moved, not ok."""
    view = _Pointers()

    def run_cli(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        view.deployment = args[1]  # the controller's cycle lands first
        if json_moved:
            view.json = "eagle3-0001"
        return subprocess.CompletedProcess(args, 3, "", f"refused: {args[1]} already drafts "
                                           "segment json of deployment default")
    rec = _segment_fault(view, _Replicas(view), run_cli, 10)
    assert rec.ok is not json_moved, rec.detail

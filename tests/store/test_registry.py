"""Registry, live pointer, rollback, audit log, leases — including concurrent promotions."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, select

from autospec import store
from autospec.store.artifacts import artifact_sha256, write_manifest
from autospec.store.errors import ArtifactError, Conflict, NotFound, StoreError
from autospec.store.models import Event, Speculator


def make_artifact(root: Path, name: str, weights: bytes | None = b"\x00\x01weights") -> str:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"kind": "eagle3", "name": name}))
    if weights is not None:
        (path / "model.safetensors").write_bytes(weights)
    write_manifest(path)
    return str(path)


def register(session, root: Path, version: str, **kw):  # type: ignore[no-untyped-def]
    uri = make_artifact(root, version)
    return store.register_speculator(
        session, version=version, kind="eagle3", target_id="smollm2-135m",
        artifact_uri=uri, sha256=artifact_sha256(uri), **kw)


def test_register_checks_the_artifact(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    uri = make_artifact(tmp_path, "a")
    digest = artifact_sha256(uri)
    with store.session_scope(engine) as s:
        with pytest.raises(ArtifactError, match="expected"):
            store.register_speculator(s, version="v1", kind="eagle3", target_id="t",
                                      artifact_uri=uri, sha256="0" * 64)
        spec = store.register_speculator(s, version="v1", kind="eagle3", target_id="t",
                                         artifact_uri=f"file://{uri}", sha256=digest,
                                         draft_vocab_size=8192)
        assert spec.state == "candidate"
    (Path(uri) / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(ArtifactError, match=r"model\.safetensors: sha256 mismatch"):
        artifact_sha256(uri)
    with store.session_scope(engine) as s:
        with pytest.raises(Conflict, match="already registered"):
            store.register_speculator(s, version="v1", kind="eagle3", target_id="t",
                                      artifact_uri="s3://bucket/x", sha256=digest, verify=False)
        with pytest.raises(ArtifactError, match="not a local path"):
            store.register_speculator(s, version="v2", kind="eagle3", target_id="t",
                                      artifact_uri="s3://bucket/x", sha256=digest)
        with pytest.raises(NotFound):
            store.register_speculator(s, version="v3", kind="eagle3", target_id="t",
                                      artifact_uri="s3://x", sha256=digest, verify=False,
                                      parent="nope")


def test_weightless_artifact_and_bad_manifests(tmp_path: Path) -> None:
    uri = make_artifact(tmp_path, "ngram", weights=None)
    assert len(artifact_sha256(uri)) == 64
    manifest = Path(uri) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["sha256"] = "f" * 64
    manifest.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="artifact sha256 does not match"):
        artifact_sha256(uri)
    manifest.write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        artifact_sha256(uri)
    manifest.unlink()
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        artifact_sha256(uri)
    with pytest.raises(ArtifactError, match="not a directory"):
        artifact_sha256(tmp_path / "nowhere")


def test_a_manifest_or_listed_file_that_cannot_be_read_is_an_artifact_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """manifest.json a directory (or a FIFO, which blocked for ever), a listed file that
    cannot be read: IsADirectoryError / PermissionError escaped artifact_sha256, which
    promote, db backup and the replicas catch as ArtifactError (ManifestError) only."""
    uri = make_artifact(tmp_path, "v1")
    manifest = Path(uri) / "manifest.json"
    good = manifest.read_text()
    manifest.unlink()
    manifest.mkdir()
    with pytest.raises(ArtifactError, match=r"manifest\.json is not a file"):
        artifact_sha256(uri)
    manifest.rmdir()
    manifest.write_text(good)

    def unreadable(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("autospec.artifacts.file_sha256", unreadable)
    with pytest.raises(ArtifactError, match=r"cannot read config\.json: Permission denied"):
        artifact_sha256(uri)


@pytest.mark.parametrize("what", ["version", "deployment", "segment"])
def test_a_name_with_a_final_newline_is_refused(engine, tmp_path: Path, what: str) -> None:  # type: ignore[no-untyped-def]
    """The names' pattern ended in "$", which re.match lets a final "\\n" through: promote
    --deployment $'prod\\n' made a pointer of deployment 'prod\\n' (so did --segment)."""
    with store.session_scope(engine) as s:
        register(s, tmp_path, "v1")
        with pytest.raises(StoreError, match=f"invalid {what} 'x\\\\n'"):
            if what == "version":
                register(s, tmp_path, "x\n")
            else:
                store.set_live(s, version="v1", actor="a", reason="r", **{what: "x\n"})


def test_promote_and_roll_back(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("v1", "v2"):
            register(s, tmp_path, v)
        store.set_live(s, version="v1", actor="alice", reason="first")
    with store.session_scope(engine) as s:
        p = store.set_live(s, version="v2", actor="controller", reason="gate passed",
                           details={"evaluation_id": 7})
        assert (p.version, p.previous_version, p.generation) == ("v2", "v1", 2)
    with store.session_scope(engine) as s:
        assert store.get_speculator(s, version="v1").state == "retired"
        p = store.rollback(s, actor="bob", reason="tau dropped")
        assert (p.version, p.previous_version, p.generation) == ("v1", "v2", 3)
    with store.session_scope(engine, readonly=True) as s:
        states = dict(s.execute(select(Speculator.version, Speculator.state)
                                .where(Speculator.version != "builtin-ngram")).all())
        assert states == {"v1": "live", "v2": "rolled_back"}
        events = store.list_events(s, kinds=["promotion", "rollback"])
        assert [(e.kind, e.version, e.from_version, e.actor) for e in events] == [
            ("rollback", "v1", "v2", "bob"),
            ("promotion", "v2", "v1", "controller"),
            ("promotion", "v1", None, "alice"),
        ]
        assert events[1].details == {"evaluation_id": 7}
        assert store.get_live(s).version == "v1"
        assert store.get_live(s, deployment="other") is None


def test_pointer_errors(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        register(s, tmp_path, "v1")
        with pytest.raises(NotFound):
            store.rollback(s, actor="a", reason="r")
        with pytest.raises(NotFound):
            store.set_live(s, version="ghost", actor="a", reason="r")
        store.set_live(s, version="v1", actor="a", reason="r")
        with pytest.raises(Conflict, match="already live"):
            store.set_live(s, version="v1", actor="a", reason="r")
        with pytest.raises(Conflict, match="no previous version"):
            store.rollback(s, actor="a", reason="r")
        register(s, tmp_path, "v2")
        store.set_state(s, version="v2", state="rejected", actor="controller", reason="worse")
        with pytest.raises(Conflict, match="rejected"):
            store.set_live(s, version="v2", actor="a", reason="r")
        store.set_live(s, version="v2", actor="ops", reason="I insist", kind="override")


def test_a_move_expecting_a_version_the_pointer_no_longer_names_moves_nothing(
        engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``expect`` is read again under the pointer lock: a cycle that evaluated against v1
    does not overwrite an operator's v2, nor does a canary of v1 roll back v2."""
    with store.session_scope(engine) as s:
        for v in ("v1", "v2", "v3"):
            register(s, tmp_path, v)
        store.set_live(s, version="v1", actor="ctl", reason="r")
        store.set_live(s, version="v2", actor="op", reason="by hand", expect="v1")
    for move in (lambda s: store.set_live(s, version="v3", actor="ctl", reason="r",
                                          expect="v1"),
                 lambda s: store.rollback(s, actor="ctl", reason="canary", expect="v1"),
                 lambda s: store.set_live(s, version="v3", actor="ctl", reason="r",
                                          segment="json", expect="v1")):
        with store.session_scope(engine) as s, pytest.raises(
                Conflict, match=r"moved from v1 to (v2|\(unpinned\)) meanwhile"):
            move(s)
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_live(s).version == "v2" and store.get_live(s, segment="json") is None
        assert [e.version for e in store.list_events(s, kinds=["promotion", "rollback"])] \
            == ["v2", "v1"]
    from autospec.store.pointers import UNPINNED

    with store.session_scope(engine) as s:  # a segment judged as following the deployment
        store.set_live(s, version="v3", actor="ctl", reason="r", segment="json",
                       expect=UNPINNED)
    with store.session_scope(engine) as s, pytest.raises(Conflict,
                                                          match=r"from \(unpinned\) to v3"):
        store.set_live(s, version="v1", actor="ctl", reason="r", segment="json",
                       expect=UNPINNED)  # an operator pinned it meanwhile


def test_failed_transaction_moves_nothing(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        register(s, tmp_path, "v1")
        register(s, tmp_path, "v2")
        store.set_live(s, version="v1", actor="a", reason="r")
    with pytest.raises(RuntimeError), store.session_scope(engine) as s:
        store.set_live(s, version="v2", actor="a", reason="r")
        raise RuntimeError("crash after the move, before commit")
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_live(s).version == "v1"
        assert store.get_speculator(s, version="v2").state == "candidate"
        assert s.scalar(select(func.count()).select_from(Event)
                        .where(Event.kind == "promotion")) == 1


def test_concurrent_promotions_leave_one_live_version(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    versions = [f"v{i}" for i in range(6)]
    with store.session_scope(engine) as s:
        for v in versions:
            register(s, tmp_path, v)
    errors: list[BaseException] = []
    moves = [0]
    lock = threading.Lock()

    def promoter(mine: list[str]) -> None:
        for _ in range(8):
            for v in mine:
                try:
                    with store.session_scope(engine) as s:
                        store.set_live(s, version=v, actor=threading.current_thread().name,
                                       reason="race")
                    with lock:
                        moves[0] += 1
                except Conflict:
                    pass  # already live / lost the race five times: allowed, state unchanged
                except BaseException as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=promoter, args=(versions[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with store.session_scope(engine, readonly=True) as s:
        pointer = store.get_live(s)
        live = s.scalars(select(Speculator.version).where(Speculator.state == "live")).all()
        promotions = s.scalar(select(func.count()).select_from(Event)
                              .where(Event.kind == "promotion"))
    assert live == [pointer.version]
    assert pointer.generation == promotions == moves[0] > 0


def test_next_version(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    day = datetime(2026, 11, 30, tzinfo=timezone.utc)
    with store.session_scope(engine) as s:
        assert store.next_version(s, kind="eagle3", now=day) == "eagle3-20261130-0001"
        register(s, tmp_path, "eagle3-20261130-0001")
        register(s, tmp_path, "eagle3-20261130-0007")
        assert store.next_version(s, kind="eagle3", now=day) == "eagle3-20261130-0008"
        assert store.next_version(s, kind="draft", now=day) == "draft-20261130-0001"


def test_leases(engine) -> None:  # type: ignore[no-untyped-def]
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ttl = timedelta(seconds=60)
    with store.session_scope(engine) as s:
        a = store.acquire_lease(s, name="cycle", holder="a", ttl=ttl, now=t0)
        assert a is not None and a.token == 1
        assert store.acquire_lease(s, name="cycle", holder="b", ttl=ttl, now=t0) is None
        again = store.acquire_lease(s, name="cycle", holder="a", ttl=ttl, now=t0)
        assert again is not None and again.token == 1  # re-entrant, same fencing token
        assert store.renew_lease(s, name="cycle", holder="a", ttl=ttl, now=t0 + ttl / 2)
        assert not store.renew_lease(s, name="cycle", holder="b", ttl=ttl, now=t0)
        later = t0 + 2 * ttl
        # expired while nobody took it (a's store was out): a may still extend it
        assert store.renew_lease(s, name="cycle", holder="a", ttl=ttl, now=later)
        assert store.acquire_lease(s, name="cycle", holder="b", ttl=ttl, now=later) is None
        later = later + 2 * ttl
        b = store.acquire_lease(s, name="cycle", holder="b", ttl=ttl, now=later)
        assert b is not None and b.token == 2  # expired: b takes over with a new token
        assert not store.renew_lease(s, name="cycle", holder="a", ttl=ttl, now=later)
        assert not store.release_lease(s, name="cycle", holder="a")
        assert store.release_lease(s, name="cycle", holder="b")
        assert store.get_lease(s, name="cycle") is None


def test_concurrent_lease_has_one_winner(engine) -> None:  # type: ignore[no-untyped-def]
    barrier = threading.Barrier(6)
    winners: list[str] = []
    errors: list[BaseException] = []

    def contender(name: str) -> None:
        barrier.wait()
        try:
            with store.session_scope(engine) as s:
                grant = store.acquire_lease(s, name="cycle", holder=name,
                                            ttl=timedelta(minutes=5))
            if grant is not None:
                winners.append(name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contender, args=(f"h{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(winners) == 1


def test_history_of_runs_and_evaluations(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        run = store.start_training_run(s, kind="eagle3", parent_version=None, train_requests=90,
                                       heldout_requests=10, config={"lr": 1e-3})
        register(s, tmp_path, "v1", training_run_id=run.id)
        store.finish_training_run(s, run_id=run.id, status="succeeded", version="v1",
                                  metrics={"loss": 1.5})
        failed = store.start_training_run(s, kind="eagle3")
        store.finish_training_run(s, run_id=failed.id, status="failed", error="OOM")
        store.record_evaluation(s, candidate="v1", incumbent=None, decision="promote",
                                reasons=["first version"], num_requests=10, tau_candidate=2.4,
                                per_segment={"chat": {"tau": 2.5}}, training_run_id=run.id)
        with pytest.raises(store.StoreError):
            store.record_evaluation(s, candidate="v1", incumbent=None, decision="maybe")
    with store.session_scope(engine, readonly=True) as s:
        runs = store.list_training_runs(s)
        assert [r.status for r in runs] == ["failed", "succeeded"]
        assert store.get_training_run(s, run_id=run.id).metrics == {"loss": 1.5}
        (ev,) = store.list_evaluations(s, candidate="v1")
        assert ev.reasons == ["first version"] and ev.per_segment["chat"]["tau"] == 2.5

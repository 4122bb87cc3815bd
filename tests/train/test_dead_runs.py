"""A training run whose process was killed outright is closed, and its artifact removed, by
the next run on its host; runs whose process may be alive are left alone."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

from autospec import store
from autospec.settings import get_settings
from autospec.train.data import WindowSpec
from autospec.train.dead_runs import is_dead, sweep_dead_runs, this_process
from autospec.train.run import TrainRequest, train_candidate

_KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from autospec import store
    from autospec.train.dead_runs import this_process
    from autospec.train.partials import partial_dir
    engine = store.open_store(sys.argv[1])
    with store.session_scope(engine) as session:
        run = store.start_training_run(session, kind="suffix",
                                       config={"process": this_process()})
    partial_dir(Path(sys.argv[2]), run.id).mkdir(parents=True)
    print(run.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # killed between its run row and its registration
""")


def _killed_run(url: str, root) -> int:
    """A run started by a real process that was then SIGKILLed; its id."""
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, url, str(root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return int(done.stdout.split()[0])


def test_the_next_run_closes_a_sigkilled_run_and_removes_its_artifact(
        sqlite_url, db_with_traffic, tiny) -> None:
    root = get_settings().resolved_artifact_dir
    dead = _killed_run(sqlite_url, root)
    assert list(root.glob(f".partial-run{dead}-*"))
    outcome = train_candidate(TrainRequest(kind="suffix", window=WindowSpec(
        heldout_fraction=0.2)), engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic) as s:
        old = store.get_training_run(s, run_id=dead)
        new = store.get_training_run(s, run_id=outcome.run_id)
        assert old.status == "failed" and old.finished_at is not None
        assert "interrupted: process" in old.error and "died" in old.error
        assert new.status == "succeeded" and new.config["process"]["pid"] == psutil.Process().pid
    assert not list(root.glob(".partial-*"))
    assert sorted(p.name for p in root.iterdir()) == [outcome.version]


def test_runs_whose_process_may_live_are_left_alone(db, tmp_path) -> None:
    me = this_process()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    cases = {
        "alive": me,
        "other host": {**me, "host": socket.gethostname() + "-elsewhere", "pid": gone.pid},
        "no record": None,
        "pid reused": {**me, "started": me["started"] - 3600},
        "dead": {**me, "pid": gone.pid},
    }
    ids = {}
    with store.session_scope(db) as s:
        for name, process in cases.items():
            config = {} if process is None else {"process": process}
            ids[name] = store.start_training_run(s, kind="suffix", config=config).id
    assert sorted(sweep_dead_runs(db, tmp_path)) == sorted([ids["pid reused"], ids["dead"]])
    with store.session_scope(db) as s:
        status = {n: store.get_training_run(s, run_id=i).status for n, i in ids.items()}
    assert status == {"alive": "running", "other host": "running", "no record": "running",
                      "pid reused": "failed", "dead": "failed"}
    assert sweep_dead_runs(db, tmp_path) == []  # closed once


def test_is_dead_tolerates_a_malformed_record() -> None:
    assert not is_dead({"host": socket.gethostname(), "pid": "not a pid"})
    assert not is_dead({"host": socket.gethostname()})
    assert not is_dead({})


_KILLED_RAY_DRIVER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    from autospec.train.dead_runs import this_process
    job = Path(sys.argv[1]) / "draft-0badf00d" / "job"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"kind": "draft", "process": this_process()}))
    (job.parent / "checkpoint_1").mkdir()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_ray_train_folder_of_a_sigkilled_driver_is_removed_by_the_next_run(
        db, tmp_path, monkeypatch) -> None:
    """`autospec train --workers 2` SIGKILLed mid-training left its Ray Train job and
    checkpoints (312 MB for a one-layer draft) under <data dir>/ray-train for good."""
    from autospec.train import ray_trainer
    from autospec.train.kinds import TraineeOptions
    from autospec.train.loop import LoopConfig

    storage = get_settings().data_dir / "ray-train"
    done = subprocess.run([sys.executable, "-c", _KILLED_RAY_DRIVER, str(storage)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    live = storage / "draft-11ve0000" / "job"  # a run of a process alive (this one)
    live.mkdir(parents=True)
    seen = {}

    def job_as_written(**_kw) -> None:  # what ray_fit wrote before it joins Ray
        seen.update(json.loads((tmp_path / "s" / "r" / "job" / "job.json").read_text()))
        raise RuntimeError("no Ray here")

    monkeypatch.setattr(ray_trainer, "connect_ray", job_as_written)
    with pytest.raises(RuntimeError, match="no Ray here"):
        ray_trainer.ray_fit(kind="suffix", config=FakeConfig(), state={}, shared={},
                            opts=TraineeOptions(), cache=FakeCache(),
                            loop=LoopConfig(epochs=1, batch_size=1, lr=0.1), workers=2,
                            storage_path=tmp_path / "s", name="r")
    assert seen["process"] == this_process()
    (live / "job.json").write_text(json.dumps({"process": seen["process"]}))
    sweep_dead_runs(db, tmp_path / "artifacts")
    assert sorted(p.name for p in storage.iterdir()) == ["draft-11ve0000"]


class FakeConfig:
    def model_dump(self, mode: str) -> dict:
        return {}


class FakeCache:
    def save(self, path) -> None:
        path.write_text("")

"""Ray Train on a Ray cluster this process did not start (a ``ray start --head`` process):
joined through ``RAY_ADDRESS`` (library) and through ``autospec train --address`` (CLI). The
run registers its candidate, the driver is connected to that cluster (not to a new local
Ray), and the cluster is still up afterwards. Slow (a Ray node starts; two Ray Train runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.train import TrainRequest, WindowSpec, train_candidate
from tests.cluster.ray_nodes import CLUSTER_ENV, TwoNodeCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodeCluster]:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    env = pytest.MonkeyPatch()
    for key, value in CLUSTER_ENV.items():
        env.setenv(key, value)
    env.delenv("RAY_ADDRESS", raising=False)
    cluster = TwoNodeCluster(cpus_per_node=2, log_dir=tmp_path_factory.mktemp("ray-head"))
    try:
        cluster.start(worker=False)
        yield cluster
    finally:
        try:
            ray.shutdown()
        finally:
            cluster.stop()
            env.undo()


def _joined(head: TwoNodeCluster) -> bool:
    import ray

    return (ray.is_initialized()
            and ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] == str(head.port))


def test_ray_train_joins_the_cluster_named_by_ray_address(head, monkeypatch, db_with_traffic,
                                                          tiny, tmp_path) -> None:
    import ray

    assert not ray.is_initialized()
    monkeypatch.setenv("RAY_ADDRESS", head.address)
    outcome = train_candidate(
        TrainRequest(kind="eagle3", epochs=1, workers=2, window=WindowSpec(heldout_fraction=0.2),
                     overrides={"draft_vocab_size": 40}, storage_path=tmp_path / "ray"),
        engine=db_with_traffic, target=tiny)
    assert outcome.metrics["workers"] == 2
    with store.session_scope(db_with_traffic, readonly=True) as s:
        assert [v.version for v in store.list_speculators(s)] == [outcome.version]
    assert _joined(head)
    ray.shutdown()  # this driver leaves; the cluster it joined stays up
    assert head.alive()


def test_cli_train_address_runs_ray_train_on_that_cluster(head, monkeypatch, db_with_traffic,
                                                          sqlite_url, tiny) -> None:
    import ray

    import autospec.engine.target as target_module

    assert not ray.is_initialized()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr(target_module, "load_target", lambda *a, **k: tiny)
    result = CliRunner().invoke(app, [
        "train", "--kind", "eagle3", "--window", "100", "--epochs", "1", "--workers", "2",
        "--address", head.address, "--draft-vocab-size", "32", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["version"].startswith("eagle3-") and data["metrics"]["workers"] == 2
    assert _joined(head)
    ray.shutdown()
    assert head.alive()

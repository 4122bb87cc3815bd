"""Ray Train on a Ray cluster this process did not start (a ``ray start --head`` process):
joined through ``RAY_ADDRESS`` (library) and through ``autospec train --address`` (CLI, a
GCS address and the head's ``ray://`` Ray Client address). The
run registers its candidate, the driver is connected to that cluster (not to a new local
Ray), and the cluster is still up afterwards. Slow (a Ray node starts; three Ray Train runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autospec import store
from tests.cluster.ray_nodes import CLUSTER_ENV, TwoNodeCluster

ROOT = Path(__file__).resolve().parents[2]

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


# Each driver runs in its own Python process: Ray Train in a process that already ran a
# Ray session (the local-Ray tests of this folder) has its controller actor cancelled on a
# second cluster, so the tests would depend on their order.
_LIBRARY = """
import json, os, sys
import ray
from autospec import store
from tests.tiny import tiny_target
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate
engine = store.open_store(sys.argv[1])
outcome = train_candidate(
    TrainRequest(kind="eagle3", epochs=1, workers=2, window=WindowSpec(heldout_fraction=0.2),
                 overrides={"draft_vocab_size": 40}, storage_path=sys.argv[2]),
    engine=engine, target=tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=0))
print(json.dumps({"version": outcome.version, "workers": outcome.metrics["workers"],
                  "gcs": ray.get_runtime_context().gcs_address}))
"""

_CLI = """
import json, sys
import ray
from typer.testing import CliRunner
import autospec.engine.target as target_module
from tests.tiny import tiny_target
from autospec.cli import app
tiny = tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=0)
target_module.load_target = lambda *a, **k: tiny
result = CliRunner().invoke(app, [
    "train", "--kind", "eagle3", "--window", "100", "--epochs", "1", "--workers", "2",
    "--address", sys.argv[1], "--set", "draft_vocab_size=32", "--json"])
assert result.exit_code == 0, result.output
data = json.loads(result.stdout)
print(json.dumps({"version": data["version"], "workers": data["metrics"]["workers"],
                  "gcs": ray.get_runtime_context().gcs_address}))
"""


def _drive(code: str, *args: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line as JSON."""
    out = subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ray_train_joins_the_cluster_named_by_ray_address(head, db_with_traffic,
                                                          tmp_path) -> None:
    url = db_with_traffic.url.render_as_string(hide_password=False)
    got = _drive(_LIBRARY, url, str(tmp_path / "ray"), env={"RAY_ADDRESS": head.address})
    assert got["workers"] == 2
    assert got["gcs"].rsplit(":", 1)[1] == str(head.port)  # joined, not a new local Ray
    with store.session_scope(db_with_traffic, readonly=True) as s:
        assert [v.version for v in store.list_speculators(s)] == [got["version"],
                                                                   "builtin-ngram"]
    assert head.alive()  # the driver left; the cluster it joined stays up


@pytest.mark.parametrize("client", [False, True], ids=["gcs", "ray-client"])
def test_cli_train_address_runs_ray_train_on_that_cluster(head, db_with_traffic, sqlite_url,
                                                          client) -> None:
    """``--address host:port`` joins as a driver on the cluster; ``--address ray://...``
    through the head's Ray Client server (a driver off the cluster, as from a laptop to
    KubeRay), where Ray Train's controller and workers run on the cluster."""
    address = head.client_address if client else head.address
    got = _drive(_CLI, address, env={"AUTOSPEC_DATABASE_URL": sqlite_url})
    assert got["version"].startswith("eagle3-") and got["workers"] == 2
    assert got["gcs"].rsplit(":", 1)[1] == str(head.port)
    assert head.alive()

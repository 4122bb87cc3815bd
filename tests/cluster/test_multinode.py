"""A real two-node Ray cluster (separate ``ray start`` processes on this machine): serving
replicas on both nodes, a 2-worker Ray Train run across them, and a promotion that reaches
every replica; each answer's ``x-autospec-replica`` header names the node that served it, so
the test sees both nodes answer before and after the promotion. Tiny random-init target with
SmolLM2's tokenizer; one SQLite store that both nodes see (same machine). Slow (two Ray nodes
start), end to end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autospec import store
from autospec.loadgen import DomainSource, Driver, LoadSpec, Schedule, run_load
from autospec.serve.http import parse_replica
from tests.serve.helpers import make_tiny_model_dir

from .ray_nodes import TwoNodeCluster, free_port, two_nodes

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodeCluster]:
    ray = pytest.importorskip("ray")
    with two_nodes(tmp_path, monkeypatch) as c:
        try:
            ray.init(address=c.address, log_to_driver=False, configure_logging=False)
            c.wait_for_nodes(ray, 2)
            yield c
        finally:
            try:
                from ray import serve

                if ray.is_initialized():
                    serve.shutdown()
            finally:
                ray.shutdown()


def _actors() -> list[dict]:
    """The GCS actor table (the state API needs the dashboard, which these nodes skip)."""
    from ray._private import state

    return list(state.actors().values())


def _replica_nodes(app: str) -> dict[str, str]:
    return {a["ActorID"]: a["Address"]["NodeID"] for a in _actors()
            if a["State"] == "ALIVE" and a["ActorClassName"].startswith(f"ServeReplica:{app}:")}


def _train_worker_nodes() -> set[str]:
    return {a["Address"]["NodeID"] for a in _actors() if "RayTrainWorker" in a["ActorClassName"]}


def _served(url: str, n: int) -> list[tuple[str | None, str | None]]:
    """(version, Ray node of the replica that answered) of ``n`` requests, 4 in flight."""
    spec = LoadSpec(schedule=Schedule.constant({"support": 1.0}), concurrency=4, requests=n)
    results = run_load(spec, DomainSource(seed=int(time.time())),
                       Driver(url, max_tokens=8, timeout_s=120, model="tiny"))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return [(r.version, parse_replica(r.replica).get("node")) for r in results]


def _versions(url: str, n: int) -> list[str | None]:
    return [version for version, _ in _served(url, n)]


def test_serving_training_and_promotion_across_two_nodes(cluster, tmp_path: Path,
                                                         sqlite_url: str) -> None:
    import ray
    from ray import serve

    from autospec.engine.target import load_target
    from autospec.serve.app import AutospecServer
    from autospec.serve.config import ServeConfig
    from autospec.train.data import WindowSpec
    from autospec.train.run import TrainRequest, train_candidate

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    db = store.open_store(sqlite_url, upgrade=True)
    data_dir = tmp_path / "autospec-data"
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    cfg = ServeConfig(target=str(model_dir), dtype="float32", device="cpu", model_name="tiny",
                      database_url=sqlite_url, poll_interval_s=0.5, replicas=2)
    # the head's proxy prefers the replica on its own node while that one has room: 2 in
    # flight per replica and 4 concurrent requests make the proxy use both nodes
    app = AutospecServer.options(
        num_replicas=2, max_replicas_per_node=1, max_ongoing_requests=2,
        ray_actor_options={"num_cpus": 0.5, "runtime_env": {
            "env_vars": {"AUTOSPEC_DATA_DIR": str(data_dir)}}},
    ).bind(cfg.model_dump(mode="json"))
    serve.run(app, name="autospec", route_prefix="/")
    url = f"http://127.0.0.1:{port}"

    # 1. two replicas, one on each node
    placed = _replica_nodes("autospec")
    assert len(placed) == 2 and set(placed.values()) == nodes, placed

    # 2. traffic through both (each answer names its replica's node), logged to the one store
    served = _served(url, 40)
    assert {version for version, _ in served} == {"builtin-ngram"}
    assert {node for _, node in served} == nodes, served
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with store.session_scope(db, readonly=True) as session:
            if store.request_counts(session).get(None, 0) >= 40:
                break
        time.sleep(0.2)

    # 3. a 2-worker Ray Train run on the cluster (1 CPU per worker, 1.5 free per node)
    target = load_target(str(model_dir), dtype="float32", device="cpu")
    outcome = train_candidate(
        TrainRequest(kind="eagle3", epochs=1, workers=2, window=WindowSpec(heldout_fraction=0.2),
                     overrides={"draft_vocab_size": 40}, batch_size=4,
                     storage_path=tmp_path / "ray-train"),
        engine=db, target=target)
    assert outcome.metrics["workers"] == 2
    assert _train_worker_nodes() == nodes  # one worker on each node

    # 4. promotion: every replica serves the new version within 30 s (a 0.5 s poll: seconds when
    # quiet; two Ray nodes and Ray Train's teardown share 2 cores here)
    with store.session_scope(db) as session:
        store.set_live(session, version=outcome.version, actor="test", reason="multi-node test")
    moved = time.monotonic()
    while set(_versions(url, 8)) != {outcome.version}:
        assert time.monotonic() - moved < 30, "a replica did not pick up the promotion"
    took = time.monotonic() - moved
    # after the promotion, replicas on both nodes answer, and every answer names the new version
    served = _served(url, 24)
    assert {version for version, _ in served} == {outcome.version}, served
    assert {node for _, node in served} == nodes, served
    assert took < 30
    db.dispose()

"""The runbook's first deploy, followed as written on a local two-node Ray cluster with
PostgreSQL (issue 31, item 6): ``autospec db upgrade``, ``autospec serve --address …
--detach --replicas 2`` (through the head's ``ray://`` address), the smoke test, the
traffic the first cycle needs, one controller cycle with the shipped ``default`` policy
(``controller once``: the cycle the controller unit's ``controller run`` starts on schedule)
and the promotion reaching the replicas.
Every step is the ``autospec`` command line in its own process, as an operator runs it; no
shipped file is edited. The two ``ray start`` nodes stand for ``ray up ops/cluster.yaml``.

The target is a tiny random-init model directory (``--target DIR --dtype float32``, as a
cluster serves a mounted model): a few minutes. ``AUTOSPEC_FIRST_DEPLOY_REAL=1`` follows the
same steps on the default target, SmolLM2-135M's real weights (~22 min on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.helpers import make_tiny_model_dir

from .ray_nodes import CLUSTER_ENV, TwoNodeCluster, free_port, two_nodes

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres,
              pytest.mark.timeout(1500)]
AUTOSPEC = str(Path(sys.executable).with_name("autospec"))
REAL = os.environ.get("AUTOSPEC_FIRST_DEPLOY_REAL") == "1"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoNodeCluster]:
    with two_nodes(tmp_path, monkeypatch) as c:
        try:
            yield c
        finally:
            _shutdown_serve(c.address)


def _shutdown_serve(address: str) -> None:
    code = ("import ray; from ray import serve; "
            f"ray.init(address={address!r}, log_to_driver=False); serve.shutdown()")
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                   env={**os.environ, **CLUSTER_ENV}, check=False)


class Operator:
    """Runs ``autospec`` commands with the deployment's environment, as an operator's shell."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log

    def __call__(self, *args: str, ok: tuple[int, ...] = (0,),
                 timeout: float = 900) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([AUTOSPEC, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        with self.log.open("a") as f:
            f.write(f"$ autospec {' '.join(args)}\n{done.stdout}{done.stderr}\n")
        assert done.returncode in ok, (args, done.returncode, done.stdout[-3000:],
                                       done.stderr[-3000:])
        return done

    def json(self, *args: str, **kw) -> dict:  # type: ignore[no-untyped-def]
        return json.loads(self(*args, "--json", **kw).stdout)


def test_the_runbooks_first_deploy_reaches_a_promotion(cluster, postgres_url: str,
                                                       tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **CLUSTER_ENV, "AUTOSPEC_DATABASE_URL": postgres_url,
           "AUTOSPEC_DATA_DIR": str(tmp_path / "shared"), "RAY_ADDRESS": cluster.address}
    env.pop("AUTOSPEC_API_KEY", None)
    run = Operator(env, tmp_path / "operator.log")

    # 1. the schema, once per release (only `db upgrade` migrates PostgreSQL)
    run("db", "upgrade")
    assert run.json("db", "current", ok=(0,))["state"] == "current"
    # 2. replicas on the cluster, detached; deployed from off the cluster, through the head's
    # Ray Client server (ray://), as from an operator's laptop (autospec.rayjoin tries again
    # where Ray's client server loses the connection's own server as it starts)
    target = [] if REAL else ["--target", str(make_tiny_model_dir(tmp_path / "model")),
                              "--dtype", "float32"]
    run("serve", "--address", cluster.client_address, "--detach", "--replicas", "2",
        "--port", str(port), *target)
    # 3. the smoke test: every request answered, traffic logged, builtin-ngram live
    smoke = tmp_path / "smoke.json"
    run("loadgen", "--url", url, "--requests", "20", "--mix", "support=1", "--json", str(smoke))
    summary = json.loads(smoke.read_text())
    assert summary["errors"] == 0 and summary["ok"] == 20, summary
    status = run.json("status")
    assert status["live"]["version"] == "builtin-ngram" and status["traffic"]["total"] >= 20
    # 4. the traffic the first cycle needs (min_fresh_requests of the shipped default)
    run("loadgen", "--url", url, "--requests", "220", "--mix", "support=1", "--concurrency", "2",
        "--json", str(tmp_path / "traffic.json"), timeout=1200)
    # 5. one cycle of the controller with the shipped policy, on the cluster
    cycle = run.json("controller", "once", "--policy", "default", "--address", cluster.address,
                     timeout=1200)
    assert cycle["outcome"] == "promoted", cycle
    promoted = cycle["promoted"]
    # 6. status and the replicas agree on the new live version
    after = run.json("status")
    assert after["live"]["version"] == promoted
    assert after["policy_in_force"]["origin"] == "recorded"
    deadline = time.monotonic() + 180  # replicas poll the pointer, then swap
    while True:
        check = tmp_path / "after.json"
        run("loadgen", "--url", url, "--requests", "4", "--mix", "support=1", "--json",
            str(check), "--per-request")
        served = json.loads(check.read_text())
        assert served["errors"] == 0, served
        if {r.get("version") for r in served["results"]} == {promoted}:
            break
        assert time.monotonic() < deadline, served["results"]
    history = run.json("history")
    assert any(e["event"] == "promotion" and e["version"] == promoted for e in history)

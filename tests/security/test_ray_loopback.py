"""A local Ray started by autospec listens on loopback only (GCS, raylet, object manager,
workers, agents), unless the operator opens it; ``autospec serve`` starts its Ray that way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autospec.raylocal import SERVE_PATIENCE, is_loopback

ROOT = Path(__file__).resolve().parents[2]


def _probe(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
           "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    env.pop("AUTOSPEC_EXPOSE_RAY", None)
    for name in SERVE_PATIENCE:
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("ray_listen_probe.py")),
                           *args], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only_and_gives_serve_patience() -> None:
    """Also: the processes it starts have Serve's proxy checks at 30 s (at Serve's 5 s, a
    loaded 2-core machine killed the demo's proxy while it started); the driver's own
    environment is put back."""
    found = _probe()
    assert is_loopback(found["node_ip"]) and all(is_loopback(n) for n in found["nodes"])
    names = {s["process"] for s in found["listening"]}
    assert {"gcs_server", "raylet"} <= names, names  # the probe sees Ray's processes
    public = [s for s in found["listening"] if not is_loopback(s["ip"])]
    assert not public, f"listening beyond loopback: {public}"
    assert found["worker_serve_env"] == SERVE_PATIENCE
    assert found["driver_serve_env"] == {}


def test_is_loopback() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.0.2.2", "10.0.0.1", "example.com", ""):
        assert not is_loopback(host), host


def test_serve_starts_its_local_ray_on_loopback_and_opens_it_only_when_asked(
        monkeypatch) -> None:
    """``deploy`` without --address: Ray picks its node IP while the local-only switch is
    on (what it would bind to is what ``get_node_ip_address`` answers then)."""
    import ray
    from ray._private import services

    from autospec.serve import cli

    seen: list[str] = []

    def fake_init(**kwargs: Any) -> None:
        assert kwargs["address"] == "local" and kwargs["include_dashboard"] is False
        seen.append(services.get_node_ip_address())
        raise KeyboardInterrupt  # stop before anything is started

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray._private.worker, "_global_node", None)
    for expose in (False, True):
        with pytest.raises(KeyboardInterrupt):
            cli.deploy(None, host="127.0.0.1", port=1, address=None,  # type: ignore[arg-type]
                       expose_ray=expose)
    assert is_loopback(seen[0])
    assert seen[1] == services.node_ip_address_from_perspective(None)  # Ray's own choice


def test_every_ray_the_package_starts_goes_through_start_local() -> None:
    """A plain ``ray.init(...)`` starts a Ray on the machine's outward address (or joins one
    found on the machine); the package calls it only to join a cluster named by
    ``address=``, and starts its own Rays with :func:`autospec.raylocal.start_local`."""
    import ast

    bare = []
    for path in sorted((ROOT / "autospec").rglob("*.py")):
        if path.name == "raylocal.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ray.init":
                address = next((k.value for k in node.keywords if k.arg == "address"), None)
                if not isinstance(address, ast.Name):  # a cluster's address, given by a user
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"ray.init that starts a Ray of its own (use start_local): {bare}"

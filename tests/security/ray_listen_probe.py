"""Run as a script: start a local Ray through autospec.raylocal (``--expose`` to open it),
print the node IP, every listening socket of this process and its descendants, and the
Serve proxy settings a Ray worker and the driver see, as JSON, shut Ray down
(tests/security/test_ray_loopback.py runs it in its own process)."""

from __future__ import annotations

import json
import os
import sys

import psutil
import ray

from autospec.raylocal import start_local


def listening() -> list[dict[str, object]]:
    me = psutil.Process()
    found = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append({"process": proc.name(), "ip": conn.laddr.ip,
                                  "port": conn.laddr.port})
        except psutil.Error:
            continue
    return found


if __name__ == "__main__":
    node_ip = start_local(expose="--expose" in sys.argv, num_cpus=1, log_to_driver=False)
    try:
        worker_env = ray.get(ray.remote(lambda: dict(os.environ)).remote())  # a worker too
        print(json.dumps({"node_ip": node_ip, "nodes": [n["NodeManagerAddress"]
                                                        for n in ray.nodes()],
                          "listening": listening(),
                          "worker_serve_env": {k: v for k, v in worker_env.items()
                                               if k.startswith("RAY_SERVE_PROXY")},
                          "driver_serve_env": {k: v for k, v in os.environ.items()
                                               if k.startswith("RAY_SERVE_PROXY")}}))
    finally:
        ray.shutdown()

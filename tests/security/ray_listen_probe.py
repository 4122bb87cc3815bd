"""Run as a script: start a local Ray through autospec.raylocal (``--expose`` to open it),
print the node IP and every listening socket of this process and its descendants as JSON,
shut Ray down (tests/security/test_ray_loopback.py runs it in its own process)."""

from __future__ import annotations

import json
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
        ray.get(ray.remote(lambda: 1).remote())  # a worker started too
        print(json.dumps({"node_ip": node_ip, "nodes": [n["NodeManagerAddress"]
                                                        for n in ray.nodes()],
                          "listening": listening()}))
    finally:
        ray.shutdown()

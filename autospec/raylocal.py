"""Start a local Ray that listens on loopback only, unless the operator opens it.

Ray chooses the address its processes listen on (GCS, raylet, object manager, workers'
gRPC, the dashboard agent, the runtime-env agent) from the node IP, and on Linux the node IP
it finds is the machine's outward address, even for ``ray.init(address="local")`` and even
when asked for ``_node_ip_address="127.0.0.1"`` (it turns loopback into that address). Its
one switch for a loopback node IP is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` ("no cluster":
what it does on a laptop), read once when Ray is imported. :func:`start_local` sets it, and
Ray's constant read from it, around ``ray.init`` (the processes it starts inherit it), then
puts both back and checks that the node it started is on loopback.

The dashboard stays off (``include_dashboard=False``, every caller); ``ray.init`` starts no
Ray client server. ``expose=True`` (``autospec serve --expose-ray``, or
``AUTOSPEC_EXPOSE_RAY=1``) keeps Ray's own choice, for nodes that must reach this one.
Joining an existing cluster (``--address``) is that cluster's configuration, not this.

A local Ray shares its machine with the target it serves (and, on a small machine, with
training and benchmarks): Serve's proxy may take longer than Serve's 5 s readiness check to
start there, and after three misses Serve kills it and ``serve.start`` fails with
``ActorDiedError`` (seen on a 2-core machine at load average 14: the demo died starting
Serve). :func:`start_local` gives the processes it starts :data:`SERVE_PATIENCE` (30 s for
the proxy's readiness and health checks) unless the environment sets them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

EXPOSE_ENV = "AUTOSPEC_EXPOSE_RAY"
#: Ray's switch: "0" = a local-only Ray, whose node IP is loopback
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Serve's proxy checks, lengthened for a local Ray on a busy machine (the environment wins)
SERVE_PATIENCE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
                  "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


class RayNotLoopback(RuntimeError):
    """The local Ray came up on a non-loopback address although loopback was asked for."""


def expose_from_env() -> bool:
    """Whether ``AUTOSPEC_EXPOSE_RAY`` asks for a Ray reachable from other machines."""
    return os.environ.get(EXPOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP, IPv4-mapped IPv6 included, or ``localhost``) is loopback."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in the environment for the duration (the processes Ray starts inherit
    them), each unless already set; put back after."""
    added = [name for name in values if name not in os.environ]
    os.environ.update({name: values[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Ray's local-only switch on for the duration (environment and Ray's constant)."""
    from ray._private import ray_constants

    before_env = os.environ.get(LOCAL_ONLY_ENV)
    before_const = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import: the import came first
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = before_env


def start_local(*, expose: bool | None = None, **init_args: Any) -> str:
    """``ray.init(address="local", include_dashboard=False, **init_args)`` on loopback
    (``expose``: None reads ``AUTOSPEC_EXPOSE_RAY``); returns the node IP. Raises
    :class:`RayNotLoopback` (after shutting that Ray down) if Ray ignored the switch."""
    import ray

    if expose is None:
        expose = expose_from_env()
    init_args.setdefault("include_dashboard", False)
    with _environment(SERVE_PATIENCE), \
            contextlib.nullcontext() if expose else _local_only():
        ray.init(address="local", **init_args)
    node_ip = ray.util.get_node_ip_address()
    if not expose and not is_loopback(node_ip):
        ray.shutdown()
        raise RayNotLoopback(f"the local Ray's node IP is {node_ip}, not loopback; this Ray "
                             f"version ignores {LOCAL_ONLY_ENV}=0")
    log.info("local Ray on %s%s", node_ip, "" if is_loopback(node_ip) else
             f" (reachable from other machines: {EXPOSE_ENV} / --expose-ray)")
    return node_ip

"""A free TCP port for a server autospec starts itself (bench, demo, soak, tests).

A port the kernel hands out for ``bind(port 0)`` comes from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768–60999 on Linux), and so do the ports a
local Ray picks for its own agents (metrics export, dashboard agent, runtime env agent) a
moment later; Ray's workers listen on 10002–19999. A port chosen from either range can be
free when probed and Ray's by the time Serve's proxy binds it: a soak once sent its traffic
to Ray's metrics exporter, which answered every path with 200. :func:`free_port` picks
from between the two ranges, where neither the kernel nor Ray picks on its own.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32767  # above Ray's worker ports, below the kernel's ephemeral range
_TRIES = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A port in ``[LOW, HIGH]`` that nothing on ``host`` listens on right now."""
    pick = random.SystemRandom()
    for _ in range(_TRIES):
        port = pick.randint(LOW, HIGH)
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free TCP port on {host} in {LOW}-{HIGH} after {_TRIES} tries")


def _bindable(host: str, port: int, *, reuse: bool = False) -> bool:
    with socket.socket() as s:
        if reuse:  # as uvicorn binds: a port whose old connections linger is still free
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def in_use(host: str, port: int) -> bool:
    """Whether something on this machine already holds ``host:port``."""
    bind_host = "0.0.0.0" if host in ("", "0.0.0.0", "::") else host
    return not _bindable(bind_host, port, reuse=True)

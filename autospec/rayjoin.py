"""Join a Ray cluster named by address, a ``ray://`` (Ray Client) address included.

A ``ray://`` address connects through the head's Ray Client server, which starts a server of
the connection's own (its "specific server") for each driver. Ray starts that server by
``fork()`` from a process busy with gRPC threads, and the child sometimes dies at once
(gRPC's ``Check failed: next_worker->state == KICKED``, its log files empty): ``ray.init``
then fails with ``Initialization failure from server ... Starting Ray client server
failed`` (ray-project/ray#63202, open for Ray 2.60; ~7 % of connections there, 5 of 32
on a 2-core machine, docs/gpu.md). Nothing was started for the driver, so :func:`join` tries
again, up to :data:`CLIENT_TRIES` times, saying so; every other failure is the caller's.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: connections tried through a Ray Client server whose per-driver server died at its start
CLIENT_TRIES = 5
#: what ``ray.init`` says when the per-driver server died starting (Ray's own words)
_SPAWN_DIED = "Starting Ray client server failed"


def join(address: str, **init_args: Any) -> None:
    """``ray.init(address=address, **init_args)``, tried again where a Ray Client server's
    per-driver server died at its start (module doc)."""
    import ray

    tries = CLIENT_TRIES if address.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, **init_args)
            return
        except ConnectionError as exc:
            if attempt == tries or _SPAWN_DIED not in str(exc):
                raise
            log.warning("the Ray Client server at %s failed to start this driver's server "
                        "(ray-project/ray#63202); trying again (%d of %d)", address,
                        attempt + 1, tries)
            ray.shutdown()

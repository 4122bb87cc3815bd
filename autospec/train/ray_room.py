"""Checks before a Ray Train run: that the cluster named answers at all, and that a local Ray
has room for the run's workers (:mod:`autospec.train.ray_trainer` calls them)."""

from __future__ import annotations

import logging
import socket

from autospec.train.errors import TrainingError

log = logging.getLogger(__name__)

#: how long joining a cluster waits for its address to answer at all
JOIN_PROBE_S = 10.0


def check_reachable(address: str) -> None:
    """A ``host:port`` cluster address where nothing answers is a :class:`TrainingError` within
    :data:`JOIN_PROBE_S`: ``ray.init`` retries such an address for ever (5 s tries, a
    ``Failed to connect to GCS`` line each). ``auto`` and ``ray://`` addresses are Ray's."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                 timeout=JOIN_PROBE_S).close()
    except ValueError:
        raise TrainingError(f"cannot join the Ray cluster at {address}: "
                            "not host:port, 'auto' or ray://host:port") from None
    except OSError as exc:
        raise TrainingError(f"cannot join the Ray cluster at {address}: nothing answers "
                            f"there ({exc.strerror or exc})") from exc


def check_room(workers: int, use_gpu: bool, *, local: bool) -> None:
    """A local Ray (no address named: no node will join it) without a CPU (and, ``use_gpu``, a
    GPU) for each worker is a :class:`TrainingError`: Ray Train waited for them for ever
    (``--use-gpu`` on a machine without a GPU hung ``autospec train``). A cluster may grow
    (an autoscaler): there it is only logged."""
    import ray

    have = ray.cluster_resources()
    short = [f"{workers} {what} (it has {have.get(what, 0):g})" for what in ("CPU", "GPU")
             if (what == "CPU" or use_gpu) and have.get(what, 0) < workers]
    if not short:
        return
    message = (f"{workers} Ray Train workers need {' and '.join(short)}: "
               f"{'lower training.workers / --workers' + (' or drop use_gpu' if use_gpu else '')}")
    if local:
        raise TrainingError(f"the local Ray cannot hold the run: {message}")
    log.warning("the Ray cluster has too little for the run now; it waits for more: %s", message)

"""The Ray Serve application: a thin deployment around :class:`LLMServer`.

Each replica builds its own :class:`~autospec.serve.server.LLMServer` (target, live version,
decoder, traffic writer; with ``engine: vllm`` vLLM's engines and OpenAI layer, see
:mod:`autospec.serve.engines`) from a
:class:`~autospec.serve.config.ServeConfig` and serves it through the FastAPI app of
:mod:`autospec.serve.http`, built at replica start
(``__serve_build_asgi_app__``); every answer names the replica, its application, Ray node
and host in ``x-autospec-replica`` (:func:`replica_identity`). Ray's health check calls
:meth:`LLMServer.health`; a replica that cannot serve is replaced.

Hot-swap does not go through Ray: every replica watches the live pointer in the database
(:mod:`autospec.serve.versions`), so a promotion or rollback from any process (the CLI, the
controller, another machine) reaches every replica without a redeploy, and the database
stays the one source of truth. ``user_config`` is not used.

Metrics: the application also runs a :class:`~autospec.serve.metrics_hub.MetricsHub`; every
replica sends it its metrics, and ``GET /metrics`` on any replica answers all of them.

``build_app(args)`` at the bottom is what ``autospec serve`` and
``serve run ops/serve_config.yaml`` (``import_path: autospec.serve.app:build_app``) call.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from autospec.serve.config import ServeConfig, checked_config
from autospec.serve.http import make_app
from autospec.serve.kernel_caches import with_kernel_cache_env
from autospec.serve.metrics_hub import MetricsHub, MetricsPusher
from autospec.serve.server import LLMServer

log = logging.getLogger(__name__)

APP_NAME = "autospec"


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except (RayServeException, RuntimeError, AttributeError):  # outside a replica
        return f"pid{os.getpid()}"


def _replica_name() -> str:
    return f"serve:{_replica_id()}"


def replica_identity() -> str:
    """The ``x-autospec-replica`` value: ``id=<Serve replica id>; app=<application>;
    node=<Ray node id>; host=<hostname>`` in a replica, ``id=pid<pid>; host=<hostname>``
    outside one."""
    host = socket.gethostname()
    try:
        ctx = serve.get_replica_context()
        replica, app = ctx.replica_id.unique_id, ctx.app_name
    except (RayServeException, RuntimeError, AttributeError):  # outside a replica
        return f"id=pid{os.getpid()}; host={host}"
    import ray

    return f"id={replica}; app={app}; node={ray.get_runtime_context().get_node_id()}; host={host}"


@serve.deployment(name="AutospecServer")
@serve.ingress()
class AutospecServer:
    """One Serve replica of the autospec application."""

    def __init__(self, config: dict[str, Any], metrics_hub: DeploymentHandle | None = None,
                 ) -> None:
        cfg = checked_config(config)
        self.server = LLMServer.from_config(cfg, actor=_replica_name())
        self.hub = metrics_hub
        self.pusher = None
        if metrics_hub is not None:
            self.pusher = MetricsPusher(metrics_hub, _replica_id(), self.server.metrics.exposition)
            self.pusher.start()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return make_app(self.server, replica=replica_identity(),
                        metrics=self._all_metrics if self.hub is not None else None)

    async def _all_metrics(self) -> bytes:
        """Every replica's metrics (this one's fresh), from the application's hub."""
        assert self.hub is not None and self.pusher is not None
        await self.hub.put.remote(self.pusher.replica, self.server.metrics.exposition().decode())
        return await self.hub.collect.remote()

    def check_health(self) -> None:
        state = self.server.health()
        if not state["ok"]:
            raise RuntimeError(f"replica cannot serve: {'; '.join(state['problems'])}")

    def __del__(self) -> None:
        pusher = getattr(self, "pusher", None)
        if pusher is not None:
            pusher.stop()
        server = getattr(self, "server", None)
        if server is not None:
            server.close()


def deployment_options(cfg: ServeConfig) -> dict[str, Any]:
    """Ray Serve's options for the replicas of ``cfg``'s application."""
    return {
        "num_replicas": cfg.replicas,
        "max_ongoing_requests": cfg.ray_max_ongoing_requests,
        "max_queued_requests": cfg.max_queued_requests,
        "ray_actor_options": with_kernel_cache_env(cfg.ray_actor_options,
                                                   cfg.kernel_cache_entries),
        "health_check_period_s": cfg.health_check_period_s,
        "health_check_timeout_s": max(30.0, cfg.health_check_period_s * 2),
    }


def build_app(args: dict[str, Any] | ServeConfig | None = None) -> Application:
    """The bound application for ``args`` (a :class:`ServeConfig` or its fields)."""
    cfg = args if isinstance(args, ServeConfig) else checked_config(args)
    deployment = AutospecServer.options(**deployment_options(cfg))
    return deployment.bind(cfg.to_args(), MetricsHub.bind())

"""The demo's serving: a new local Ray with two Serve applications on the same target, and
the wait for the live one to serve a promoted version.

``live`` follows the live pointer (the training-free ``builtin-ngram`` until a promotion)
and logs traffic; ``target`` has speculation off and logs nothing (the target-only
baseline). Ray starts with ``address="local"``: never another user's cluster.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests as http

from autospec.demo.plan import DemoPlan
from autospec.loadgen.client import Driver
from autospec.ports import free_port
from autospec.settings import api_key

log = logging.getLogger(__name__)

DEPLOYMENT = "default"
#: seconds the demo waits for the replica to serve a promoted version (native: a load; vLLM:
#: an engine start, 20-130 s on 2 cores, more under load)
SWAP_TIMEOUT_S, VLLM_SWAP_TIMEOUT_S = 60.0, 600.0
#: vLLM engine arguments of the demo's replicas: a short context (demo requests are short)
#: and a small KV cache (two apps, and a third engine during a swap, share the machine)
VLLM_OPTIONS = {"max_model_len": 1024, "kv_cache_memory_bytes": 128 << 20}


@dataclass
class Apps:
    """The two running applications: their base URL and a client for each."""

    base_url: str
    live: Driver
    baseline: Driver


def start_serving(plan: DemoPlan, *, data_dir: Path, target: str, dtype: str,
                  db_url: str) -> Apps:
    """Start a local Ray, Serve, and the ``live`` and ``target`` applications."""
    from ray import serve

    from autospec.raylocal import start_local
    from autospec.serve.app import build_app

    start_local(num_cpus=4, log_to_driver=False,  # on loopback: autospec.raylocal
                namespace=f"autospec-demo-{uuid.uuid4().hex[:8]}", configure_logging=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    env = {"AUTOSPEC_DATA_DIR": str(data_dir)}
    common = {"target": target, "dtype": dtype, "model_name": "demo",
              "database_url": db_url, "speculator_k": plan.k,
              "engine": plan.engine, "vllm_options": VLLM_OPTIONS,
              "deployment": DEPLOYMENT, "poll_interval_s": 0.5,
              "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": env}},
              "api_key": api_key()}  # AUTOSPEC_API_KEY: the Drivers below send it
    base_url = f"http://127.0.0.1:{port}"
    for name, extra in (("live", {}), ("target", {"speculation": "off",
                                                 "log_traffic": False})):
        serve.run(build_app({**common, **extra}), name=name, route_prefix=f"/{name}")
    kw: dict[str, Any] = {"max_tokens": plan.max_tokens, "temperature": 0.0,
                          "timeout_s": 600.0, "model": "demo",
                          "stream": True}  # time to first token: rates after it (phases.rate)
    return Apps(base_url, Driver(f"{base_url}/live", **kw), Driver(f"{base_url}/target", **kw))


def stop_serving() -> None:
    """Shut Serve and Ray down, if this process started them."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.shutdown()
        except Exception as exc:  # Ray goes down below all the same
            log.warning("Serve did not shut down cleanly: %s", exc)
        finally:
            ray.shutdown()


def swap_timeout(engine: str) -> float:
    """How long a promoted version may take to be served on ``engine``."""
    return SWAP_TIMEOUT_S if engine == "native" else VLLM_SWAP_TIMEOUT_S


def wait_for_version(store_engine: Any, live_url: str, version: str | None,
                     timeout_s: float, say: Callable[[str], None]) -> None:
    """Until the live app's replica reports ``version`` (None: the live pointer's, e.g.
    after a rollback) — a hot-swap; on vLLM the replica starts an engine for it first."""
    from autospec import store
    from autospec.versions import BUILTIN_VERSION

    if version is None:
        with store.session_scope(store_engine, readonly=True) as session:
            pointer = store.get_live(session, deployment=DEPLOYMENT)
            version = pointer.version if pointer else BUILTIN_VERSION
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            got = http.get(f"{live_url}/health", timeout=10).json().get("version")
        except (http.RequestException, ValueError):
            got = None
        if got == version:
            say(f"replica serves {version} "
                f"{time.monotonic() - started:.1f}s after the pointer moved")
            return
        time.sleep(0.2)
    log.warning("the replica did not report %s within %.0fs", version, timeout_s)


def wait_for_segments(store_engine: Any, live_url: str, timeout_s: float,
                      say: Callable[[str], None]) -> None:
    """Until the live app's replica drafts each segment that has a pointer of its own with
    that pointer's version (``/health``'s ``segments``)."""
    from autospec import store

    with store.session_scope(store_engine, readonly=True) as session:
        wanted = {p.segment: p.version
                  for p in store.list_segment_pointers(session, deployment=DEPLOYMENT)}
    if not wanted:
        return
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            got = http.get(f"{live_url}/health", timeout=10).json().get("segments") or {}
        except (http.RequestException, ValueError):
            got = {}
        if all(got.get(s) == v for s, v in wanted.items()):
            say(f"replica drafts segments {wanted} "
                f"{time.monotonic() - started:.1f}s after the pointers moved")
            return
        time.sleep(0.2)
    log.warning("the replica did not draft segments %s within %.0fs", wanted, timeout_s)

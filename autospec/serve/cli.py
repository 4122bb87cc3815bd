"""``autospec serve``: start (or join) Ray, deploy the serving application, print its URL.

By default a local Ray is started in this process and the command blocks until Ctrl-C,
then shuts the application down. With ``--address`` it joins an existing cluster; add
``--detach`` to deploy and return, leaving the application running there. Start-up is
bounded (``--startup-timeout``): replicas that are not ready in time fail the command.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import typer

log = logging.getLogger(__name__)


def serve(
    target: str = typer.Option("smollm2-135m", help="target: a name, a model directory or .gguf"),
    replicas: int = typer.Option(1, min=1, help="Serve replicas (each one decode thread)"),
    max_ongoing_requests: int | None = typer.Option(
        None, min=1, help="Ray Serve's limit of requests in flight per replica; must exceed "
        "--max-pending-requests (default: twice it)"),
    max_pending_requests: int = typer.Option(
        32, min=1, help="requests waiting or decoding per replica before a fast 503"),
    host: str = typer.Option("127.0.0.1", help="HTTP host to bind"),
    port: int = typer.Option(8000, min=1, max=65535, help="HTTP port"),
    address: str | None = typer.Option(
        None, help="join this Ray cluster (e.g. 'auto' or ray://host:10001); default: start "
        "a local Ray"),
    speculator_k: int = typer.Option(5, min=1, max=16, help="draft tokens per step"),
    speculation: str = typer.Option(
        "live", help="live: the live version (builtin-ngram until one is promoted); "
        "off: target only"),
    deployment: str = typer.Option("default", help="the live-pointer name to follow"),
    dtype: str = typer.Option("auto", help="target dtype: auto, float32 or bfloat16"),
    database_url: str | None = typer.Option(
        None, help="traffic store (default: AUTOSPEC_DATABASE_URL or the data dir's SQLite)"),
    log_traffic: bool = typer.Option(True, help="log every request to the traffic store"),
    num_cpus: float = typer.Option(1.0, help="CPUs reserved per replica"),
    num_gpus: float = typer.Option(0.0, help="GPUs per replica"),
    startup_timeout: float = typer.Option(300.0, help="seconds to wait for the replicas"),
    detach: bool = typer.Option(False, help="with --address: deploy and return"),
) -> None:
    """Serve the target with speculative decoding over an OpenAI-compatible HTTP API."""
    from pydantic import ValidationError

    from autospec.serve.config import ServeConfig

    if detach and address is None:
        raise typer.BadParameter("--detach needs --address (a local Ray ends with this command)")
    actor_options: dict[str, float] = {"num_cpus": num_cpus}
    if num_gpus:
        actor_options["num_gpus"] = num_gpus
    try:
        config = ServeConfig(
            target=target, replicas=replicas, max_ongoing_requests=max_ongoing_requests,
            max_pending_requests=max_pending_requests, speculator_k=speculator_k,
            speculation=speculation, deployment=deployment, dtype=dtype,  # type: ignore[arg-type]
            database_url=None, log_traffic=log_traffic, ray_actor_options=actor_options,
            startup_timeout_s=startup_timeout)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    config = config.model_copy(update={"database_url": _prepare_database(database_url)})
    endpoint = deploy(config, host=host, port=port, address=address)
    typer.echo(f"autospec is serving {target} at {endpoint}  (OpenAI API: {endpoint}/v1)")
    if detach:
        return
    typer.echo("Ctrl-C to stop.")
    _wait_for_interrupt()


def _prepare_database(database_url: str | None) -> str:
    """The store URL replicas will use; a SQLite store is created/upgraded here, once."""
    from autospec import store
    from autospec.settings import get_settings

    url = database_url or get_settings().resolved_database_url
    engine = store.open_store(url, upgrade=url.startswith("sqlite"))
    engine.dispose()
    return url


def deploy(config, *, host: str, port: int, address: str | None) -> str:  # type: ignore[no-untyped-def]
    """Start or join Ray, run the application, wait (bounded) until ready; return its URL."""
    import ray
    from ray import serve

    from autospec.serve.app import APP_NAME, build_app

    ray.init(address=address, namespace="autospec", ignore_reinit_error=True,
             include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(serve.run, build_app(config), name=APP_NAME, route_prefix="/")
        try:
            future.result(timeout=config.startup_timeout_s)
        except FutureTimeout:
            raise typer.Exit(_startup_failed(config.startup_timeout_s)) from None
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}"


def _startup_failed(timeout: float) -> int:
    typer.echo(f"replicas were not ready within {timeout:.0f}s; see `serve status`", err=True)
    return 1


def _wait_for_interrupt() -> None:
    from ray import serve

    stop = threading.Event()
    try:
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        typer.echo("stopping...")
    finally:
        serve.shutdown()
        time.sleep(0.1)

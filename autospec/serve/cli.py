"""``autospec serve``: start (or join) Ray, deploy the serving application, print its URL.

By default a new local Ray is started in this process (never one found on the machine) and
the command blocks until Ctrl-C, SIGINT or SIGTERM, then shuts down Serve, that Ray and
every process it started: Ray's dashboard and runtime-env agents ignore SIGTERM and would
outlive ``ray.shutdown()``, so what is still running of the processes below this one is
terminated, then killed. A signal during start-up does the same. With ``--address`` it joins
an existing cluster, and on a signal deletes only its application and disconnects; add
``--detach`` to deploy and return, leaving the application running there. Start-up is
bounded (``--startup-timeout``): replicas that are not ready in time fail the command.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import psutil
import typer

from autospec.cli_options import (
    DatabaseUrl,
    check_engine_options,
    deployment_name,
    engine_options,
)
from autospec.engine.choice import ENGINE_HELP

if TYPE_CHECKING:  # imported where it is used: it brings torch
    from autospec.serve.config import ServeConfig

log = logging.getLogger(__name__)

#: ServeConfig fields that ``autospec serve`` does not take as options, and why; every other
#: field is an option of the same name (or :data:`OPTION_OF`'s) with the field's default and
#: description as its help (tests/serve/test_cli.py keeps the two from drifting apart)
CONFIG_ONLY = {
    "kernel_cache_entries": "tuning, in the Serve config file",
    "device": "a replica's device follows its Ray resources (num_gpus) and the engine",
    "model_name": "the Serve config file's (ops/serve_config.yaml): the target spec by default",
    "poll_interval_s": "tuning, in the Serve config file",
    "report_interval_s": "tuning, in the Serve config file",
    "max_tokens_limit": "tuning, in the Serve config file",
    "default_max_tokens": "tuning, in the Serve config file",
    "max_body_bytes": "tuning, in the Serve config file",
    "max_queued_requests": "Ray's router queue: unbounded unless the Serve config file says",
    "health_check_period_s": "tuning, in the Serve config file",
}
#: fields whose option has another name (and shape: KEY=VALUE pairs, Ray's resources)
OPTION_OF = {"vllm_options": "vllm_option", "vllm_api_options": "vllm_api_option",
             "ray_actor_options": "num_cpus", "startup_timeout_s": "startup_timeout",
             "segments": "segment_rules"}


def serve(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(
        help="target: a name, a model directory or .gguf")] = "smollm2-135m",
    replicas: Annotated[int, typer.Option(
        min=1, help="Serve replicas (each its own target and engine)")] = 1,
    max_ongoing_requests: Annotated[int | None, typer.Option(
        min=1, help="Ray Serve's per-replica limit of requests in flight; must exceed "
        "max_pending_requests so the replica's own 503 answers overload (default: twice "
        "max_pending_requests)")] = None,
    max_pending_requests: Annotated[int, typer.Option(
        min=1, help="requests waiting or decoding per replica; more get a fast 503")] = 32,
    max_queue_wait_s: Annotated[float, typer.Option(
        min=0, help="seconds a request may wait in a replica's queue without starting to "
        "decode; past it, it gets the same 503 (Retry-After) and is never decoded, so a "
        "client waiting longer than this plus its decode (the openai client: 600 s) hears "
        "overload, not a timeout (0: no bound; native engine: vLLM schedules its own "
        "queue)")] = 60.0,
    host: Annotated[str, typer.Option(help="HTTP host to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help=(
        "HTTP port (with a local Ray, refused at once if another process holds it)"))] = 8000,
    address: Annotated[str | None, typer.Option(
        help="join this Ray cluster (e.g. 'auto' or ray://host:10001); default: start a local "
        "Ray")] = None,
    expose_ray: Annotated[bool, typer.Option(
        envvar="AUTOSPEC_EXPOSE_RAY", show_envvar=True,
        help="the local Ray's ports (GCS, raylet, object manager, workers, agents) listen on "
        "the machine's address, not loopback only (for nodes that join it); without "
        "--address only; the HTTP API's address is --host")] = False,
    speculator_k: Annotated[int, typer.Option(
        "--speculator-k", "--k", min=1, max=16,
        help="draft tokens per verification step")] = 5,
    k_bands: Annotated[str | None, typer.Option(
        help="draft tokens per concurrency band, e.g. '1-2:5,3-6:3,7-:0' (0: no drafting at "
        "that load; see docs/vllm.md, 'Speed at the load served'); on vLLM the batch size of "
        "a step, on the native engine the requests in flight when one starts; `autospec bench "
        "serve --engine vllm --concurrency 1,4,8` shows where speculation stops paying")] = None,
    holdout_fraction: Annotated[float, typer.Option(
        min=0.0, max=0.5, help="share of requests served with speculation off, drawn at "
        "random (native engine only): the ledger's control group, whose decode rate is its "
        "target-only rate for the period, timed at the load served (docs/ledger.md); 0: "
        "none")] = 0.0,
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "auto",
    vllm_option: Annotated[list[str] | None, typer.Option(
        help="--engine vllm: a vLLM engine argument as KEY=VALUE (VALUE as JSON, else a "
        "string), e.g. max_model_len=4096 or kv_cache_memory_bytes=1073741824; repeatable")
    ] = None,
    vllm_api_option: Annotated[list[str] | None, typer.Option(
        help="--engine vllm: an option of vLLM's OpenAI server as KEY=VALUE (a `vllm serve` "
        "flag without the dashes; VALUE as JSON, else a string), e.g. "
        "tool_call_parser=hermes, enable_auto_tool_choice=true; repeatable")
    ] = None,
    speculation: Annotated[str, typer.Option(
        help="live: follow the live pointer (builtin-ngram until one exists); off: "
        "target-only decoding")] = "live",
    deployment: Annotated[str, typer.Option(callback=deployment_name,
        help="live-pointer name this app follows")] = "default",
    dtype: Annotated[str, typer.Option(
        help="target dtype: auto, float32 or bfloat16")] = "auto",
    database_url: DatabaseUrl = None,
    log_traffic: Annotated[bool, typer.Option(
        help="log every request to the traffic store")] = True,
    num_cpus: Annotated[float, typer.Option(min=0.0, help="CPUs reserved per replica")] = 1.0,
    num_gpus: Annotated[float, typer.Option(min=0.0, help="GPUs per replica")] = 0.0,
    startup_timeout: Annotated[float, typer.Option(
        help="seconds `autospec serve` waits for the replicas to be ready")] = 300.0,
    detach: Annotated[bool, typer.Option(help="with --address: deploy and return")] = False,
    api_key: Annotated[str | None, typer.Option(
        envvar="AUTOSPEC_API_KEY", show_envvar=True, show_default=False,
        help="clients must send 'Authorization: Bearer <key>' on every route but /health and "
        "/metrics; several keys comma-separated (default: AUTOSPEC_API_KEY in the replica's "
        "environment; no key and no key file: no authentication)")] = None,
    api_key_file: Annotated[Path | None, typer.Option(
        envvar="AUTOSPEC_API_KEY_FILE", show_envvar=True, show_default=False,
        help="a file of keys, one per line, that each replica re-reads when it changes (key "
        "rotation without restart; the same path on every node; default: "
        "AUTOSPEC_API_KEY_FILE in the replica's environment)")] = None,
    docs: Annotated[bool, typer.Option(
        help="serve the interactive API docs at /docs (Swagger UI, which loads its scripts "
        "from a CDN); /openapi.json is served either way")] = False,
    segment_rules: Annotated[Path | None, typer.Option(
        help="a YAML file of segment rules (a list, or `segments:` and a list; first match "
        "wins; docs/segments.md): which traffic segment each request belongs to, and so "
        "which segment pointer's version drafts it")] = None,
) -> None:
    """Serve the target with speculative decoding over an OpenAI-compatible HTTP API."""
    from pydantic import ValidationError

    from autospec.option_errors import file_errors, option_errors
    from autospec.serve.config import ServeConfig

    if detach and address is None:
        raise typer.BadParameter("--detach needs --address (a local Ray ends with this command)")
    if expose_ray and address is not None:
        if _given(ctx, "expose_ray"):
            raise typer.BadParameter("--expose-ray is for the local Ray; a joined cluster's "
                                     "addresses are its own", param_hint="--expose-ray")
        expose_ray = False  # AUTOSPEC_EXPOSE_RAY: the machine's setting, for a local Ray
    _check_port(host, port, local=address is None)
    if address is None:  # a joined cluster's nodes find the target themselves
        _check_target(target)
    actor_options: dict[str, float] = {"num_cpus": num_cpus}
    if num_gpus:
        actor_options["num_gpus"] = num_gpus
    try:
        config = ServeConfig.model_validate(dict(  # the options' strings, checked by it
            target=target, replicas=replicas, max_ongoing_requests=max_ongoing_requests,
            max_pending_requests=max_pending_requests, max_queue_wait_s=max_queue_wait_s,
            speculator_k=speculator_k, k_bands=k_bands, holdout_fraction=holdout_fraction,
            speculation=speculation,
            deployment=deployment, dtype=dtype,
            engine=engine, vllm_options=engine_options(vllm_option or []),
            vllm_api_options=engine_options(vllm_api_option or [], "--vllm-api-option"),
            database_url=None, log_traffic=log_traffic, ray_actor_options=actor_options,
            startup_timeout_s=startup_timeout, api_key=api_key or None, docs=docs,
            segments=_segment_rules(segment_rules),
            api_key_file=api_key_file.resolve() if api_key_file else None))
    except ValidationError as exc:  # the rules file's errors as its shape errors read
        if rules := file_errors(exc, "segments", segment_rules):
            raise typer.BadParameter(rules, param_hint="--segment-rules") from None
        raise typer.BadParameter(option_errors(exc, OPTION_OF)) from None
    _check_key_file(config.api_key_file)
    _check_api_options(config.vllm_api_options)
    check_engine_options(config.vllm_options)
    config = config.model_copy(update={"database_url": _prepare_database(database_url)})
    _signals_interrupt()  # SIGTERM as Ctrl-C, from here on: start-up included
    try:
        endpoint = deploy(config, host=host, port=port, address=address, expose_ray=expose_ray)
        typer.echo(f"autospec is serving {target} at {endpoint}  (OpenAI API: {endpoint}/v1)")
        if detach:
            return
        typer.echo("Ctrl-C to stop.")
        _wait_for_interrupt()
    except KeyboardInterrupt:
        typer.echo("stopping...")
    finally:
        if not detach:
            shut_down(local=address is None)


def _check_port(host: str, port: int, *, local: bool) -> None:
    """Refuse a port another process holds before a local Ray starts: Serve's proxy would
    fail to bind it while the replicas came up, and the URL printed would be someone
    else's. (A joined cluster's Serve may hold the port itself: left to Serve.)"""
    from autospec.ports import in_use

    if local and in_use(host, port):
        raise typer.BadParameter(f"{host}:{port} is already in use by another process; "
                                 "stop it or pick another --port", param_hint="--port")


def _check_target(target: str) -> None:
    """A ``--target`` that names no target on this machine (no known name, model directory
    or .gguf) is a usage error before a local Ray starts (as ``autospec demo``'s)."""
    from autospec.engine.target import TargetLoadError, check_spec

    try:
        check_spec(target)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--target") from None


def _segment_rules(path: Path | None) -> list[Any]:
    """The rules of ``--segment-rules`` as data (ServeConfig checks each rule)."""
    import yaml

    from autospec.text_file import TextFileError, read_text_file

    if path is None:
        return []
    try:
        data = yaml.safe_load(read_text_file(path, "segment rules file"))
    except TextFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--segment-rules") from None
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--segment-rules") from None
    if isinstance(data, dict) and set(data) == {"segments"}:
        data = data["segments"]
    if not isinstance(data, list) or not data:  # an empty list: no rules, as without it
        raise typer.BadParameter(f"{path}: expected a list of rules (or `segments:` and a "
                                 f"list){', not an empty one' if data == [] else ''}",
                                 param_hint="--segment-rules")
    return data


def _check_key_file(path: Path | None) -> None:
    """A key file this machine cannot read is a usage error before any replica starts."""
    from autospec.serve.auth import KeyFileError, KeyRing

    if path is None:
        return
    try:
        KeyRing(file=path, require_key=True)
    except KeyFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--api-key-file") from None


def _check_api_options(options: dict[str, Any]) -> None:
    """Refuse, before any replica starts, a ``--vllm-api-option`` vLLM's server does not
    take (the replicas check again with their own vLLM)."""
    from autospec.serve.vllm_openai import ApiOptionError, api_args

    if not options:
        return
    try:
        api_args("model", "model", options)
    except ApiOptionError as exc:
        raise typer.BadParameter(str(exc)) from None
    except ImportError:
        raise typer.BadParameter("--vllm-api-option needs vLLM installed (`--engine vllm`)") \
            from None


def _prepare_database(database_url: str | None) -> str:
    """The store URL replicas will use; a SQLite store is created/upgraded here, once."""
    from autospec import store
    from autospec.settings import get_settings

    url = database_url or get_settings().resolved_database_url
    engine = store.open_store(url, upgrade="embedded")
    engine.dispose()
    return url


def deploy(config: ServeConfig, *, host: str, port: int, address: str | None,
           expose_ray: bool = False) -> str:
    """Start (on loopback unless ``expose_ray``: :mod:`autospec.raylocal`) or join Ray, run
    the application, wait (bounded) until ready; return its URL."""
    from ray import serve

    from autospec.rayjoin import join
    from autospec.raylocal import start_local
    from autospec.serve.app import APP_NAME, build_app

    # address None: a new local Ray (ray.init(None) would join one found on the machine)
    if address is None:
        start_local(expose=expose_ray, namespace="autospec", ignore_reinit_error=True)
    else:
        try:
            join(address, namespace="autospec", ignore_reinit_error=True,
                 include_dashboard=False)
        except ConnectionError as exc:  # no cluster there (ray.init's own words say so)
            raise typer.BadParameter(f"{address!r}: {exc}", param_hint="--address") from None
    _signals_interrupt()  # ray.init installs its own SIGTERM handler (sys.exit): ours again
    serve.start(http_options={"host": host, "port": port})
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(serve.run, build_app(config), name=APP_NAME, route_prefix="/")
        try:
            future.result(timeout=config.startup_timeout_s)
        except FutureTimeout:
            raise typer.Exit(_startup_failed(config.startup_timeout_s)) from None
        except RuntimeError as exc:  # Serve gave up on the replicas (each start failed)
            raise typer.Exit(_deploy_failed(exc, APP_NAME)) from None
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}"


def _startup_failed(timeout: float) -> int:
    typer.echo(f"replicas were not ready within {timeout:.0f}s; see `serve status`", err=True)
    return 1


def _deploy_failed(exc: RuntimeError, app_name: str) -> int:
    """Say why Serve could not deploy the application: its error, and the last line of the
    replicas' (Serve's status keeps their tracebacks; the log above has them whole)."""
    cause = _replica_failure(app_name)
    typer.echo(f"error: {exc}" + (f"\n  a replica failed to start: {cause}" if cause else ""),
               err=True)
    return 1


def _replica_failure(app_name: str) -> str | None:
    """The last line of the first failed deployment's message in Serve's status, or None."""
    try:
        from ray import serve

        app = serve.status().applications.get(app_name)
        messages = [d.message for d in app.deployments.values() if d.message] if app else []
    except Exception:  # the status is a courtesy: the error above stands without it
        return None
    lines = [line.strip() for line in (messages[0] if messages else "").splitlines()]
    return next((line for line in reversed(lines) if line), None)


def _signals_interrupt() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, as SIGINT does."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def _wait_for_interrupt() -> None:
    stop = threading.Event()
    while not stop.wait(3600):
        pass


def shut_down(*, local: bool, grace_s: float = 10.0) -> None:
    """Stop what ``serve`` started: with a local Ray, Serve, Ray and every process below this
    one; joined to a cluster, only the application (other applications keep running)."""
    import ray
    from ray import serve

    from autospec.serve.app import APP_NAME

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut this short
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started = _descendants() if local else []
    try:
        if ray.is_initialized() and local:
            serve.shutdown()
        elif ray.is_initialized():
            serve.delete(APP_NAME)
    except Exception as exc:  # Ray goes down below all the same
        log.warning("Serve did not shut down cleanly: %s", exc)
    finally:
        ray.shutdown()
        _reap(started, grace_s)


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _reap(processes: list[psutil.Process], grace_s: float) -> None:
    """Terminate, then kill, those of ``processes`` still running (psutil checks each is
    still the process it was, so a reused pid is never signalled)."""
    alive = [p for p in processes if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            log.warning("killing %s (pid %d): it ignored SIGTERM", p.name(), p.pid)
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was on the command line (not from its variable or default)."""
    source = ctx.get_parameter_source(name)  # typer's own click: compared by name
    return source is not None and source.name == "COMMANDLINE"

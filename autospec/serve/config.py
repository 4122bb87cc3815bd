"""The serving configuration: one strict pydantic model shared by the CLI, the Ray Serve
config file (``ops/serve_config.yaml``, ``args:``) and the tests. ``autospec serve``'s
options carry these fields' defaults and descriptions (tests/serve/test_cli.py checks them;
the fields that are not options are :data:`autospec.serve.cli.CONFIG_ONLY`).

A typo in a field name is an error naming the field (``extra="forbid"``). The model knows
nothing of Ray: replica counts and Ray's own queue limits are read by
:mod:`autospec.serve.app` when it builds the application. Overload is answered by the
replica (OpenAI-shaped 503 with ``Retry-After``), never by Ray: Ray's in-flight limit per
replica stays above the replica's pending limit and Ray's router queue is unbounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autospec.engine.choice import ENGINE_HELP
from autospec.serve.bands import MAX_K, KBands, parse_bands, vllm_bands_refusal
from autospec.serve.segments import SegmentRule
from autospec.settings import DATABASE_URL_HELP

# the version name served while no version is live (the training-free n-gram speculator);
# one name in the store's models, read by serving, evaluation and the controller alike
from autospec.store.models import BUILTIN_VERSION

__all__ = ["BUILTIN_VERSION", "OFF_VERSION", "ServeConfig"]

#: the version name served with speculation off (target-only decoding)
OFF_VERSION = "off"
#: why a holdout is refused on vLLM (autospec/serve/holdout.py)
HOLDOUT_ON_VLLM = (
    "holdout_fraction needs the native engine: in a vLLM batch a request without drafts "
    "still waits for the step that verifies the others' drafts, so its rate is not the "
    "target's alone (the ledger keeps the gate's rate on vLLM; docs/ledger.md)")


class ServeConfig(BaseModel):
    """What one serving application runs and how it behaves under load."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field("smollm2-135m", description="target: a name, a model directory or .gguf")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="target dtype: auto, float32 or bfloat16")
    device: str | None = Field(None, description="torch device (default: cuda if present)")
    model_name: str | None = Field(
        None, description="the model id clients name in requests (default: the target spec)")
    deployment: str = Field("default", description="live-pointer name this app follows")
    engine: Literal["auto", "native", "vllm"] = Field("auto", description=ENGINE_HELP)
    vllm_options: dict[str, Any] = Field(
        default_factory=dict, description="engine: vllm: extra vLLM engine arguments "
        "(max_model_len, kv_cache_memory_bytes, gpu_memory_utilization, "
        "tensor_parallel_size, enforce_eager, ...)")
    vllm_api_options: dict[str, Any] = Field(
        default_factory=dict, description="engine: vllm: options of vLLM's OpenAI server "
        "(`vllm serve` flags without the dashes: tool_call_parser, enable_auto_tool_choice, "
        "chat_template, reasoning_parser, response_role, ...; true for a bare flag)")
    speculation: Literal["live", "off"] = Field(
        "live", description="live: follow the live pointer (builtin-ngram until one exists); "
        "off: target-only decoding")
    speculator_k: int = Field(5, ge=1, le=MAX_K,
                              description="draft tokens per verification step")
    k_bands: str | None = Field(
        None, description="draft tokens per concurrency band, e.g. '1-2:5,3-6:3,7-:0' (0: no "
        "drafting at that load; see docs/vllm.md, 'Speed at the load served'); on vLLM the "
        "batch size of a step, on the native engine the requests in flight when one starts; "
        "`autospec bench serve --engine vllm --concurrency 1,4,8` shows where speculation "
        "stops paying")
    holdout_fraction: float = Field(
        0.0, ge=0.0, le=0.5, description="share of requests served with speculation off, "
        "drawn at random (native engine only): the ledger's control group, whose decode "
        "rate is its target-only rate for the period, timed at the load served "
        "(docs/ledger.md); 0: none")
    segments: list[SegmentRule] = Field(
        default_factory=list, description="segment rules, first match wins: each names a "
        "`segment` and matches by `model`, `system_sha256` (hex prefix) and/or `header` + "
        "`value`; a request's x-autospec-segment header wins over them, no match: the route "
        "(docs/segments.md)")
    database_url: str | None = Field(None, description=DATABASE_URL_HELP)
    log_traffic: bool = Field(True, description="log every request to the traffic store")
    poll_interval_s: float = Field(
        1.0, gt=0, le=60, description="how often each replica reads the live pointer")
    report_interval_s: float = Field(
        10.0, gt=0, le=300, description="how often each replica reports the version it serves "
        "(`autospec status` shows the reports)")
    max_tokens_limit: int = Field(2048, ge=1, description="largest max_tokens accepted")
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a chat omits it")
    max_pending_requests: int = Field(
        32, ge=1, description="requests waiting or decoding per replica; more get a fast 503")
    max_queue_wait_s: float = Field(
        60.0, ge=0, description="seconds a request may wait in a replica's queue without "
        "starting to decode; past it, it gets the same 503 (Retry-After) and is never "
        "decoded, so a client waiting longer than this plus its decode (the openai client: "
        "600 s) hears overload, not a timeout (0: no bound; native engine: vLLM schedules "
        "its own queue)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body accepted")
    replicas: int = Field(1, ge=1, description="Serve replicas (each its own target and "
                          "engine)")
    max_ongoing_requests: int | None = Field(
        None, ge=1, description="Ray Serve's per-replica limit of requests in flight; must "
        "exceed max_pending_requests so the replica's own 503 answers overload (default: "
        "twice max_pending_requests)")
    max_queued_requests: int = Field(
        -1, ge=-1, description="Ray Serve's limit of requests queued at the router (-1: none; "
        "past a limit Ray answers a text/plain 503 itself)")
    ray_actor_options: dict[str, Any] = Field(
        default_factory=lambda: {"num_cpus": 1.0},
        description="Ray options per replica (num_cpus, num_gpus, runtime_env)")
    kernel_cache_entries: int | None = Field(
        64, ge=1, description="bound on the CPU bfloat16 matmul path's per-shape kernel caches "
        "(ideep's LRU_CACHE_CAPACITY and oneDNN's ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024 "
        "each by default), set in each replica's environment so its memory does not grow "
        "with the prompt lengths it has seen; a value the operator set is kept (null: the "
        "libraries' defaults)")
    api_key: SecretStr | None = Field(
        None, description="clients must send 'Authorization: Bearer <key>' on every route "
        "but /health and /metrics; several keys comma-separated (default: AUTOSPEC_API_KEY "
        "in the replica's environment; no key and no key file: no authentication)")
    api_key_file: Path | None = Field(
        None, description="a file of keys, one per line, that each replica re-reads when it "
        "changes (key rotation without restart; the same path on every node; default: "
        "AUTOSPEC_API_KEY_FILE in the replica's environment)")
    docs: bool = Field(
        False, description="serve the interactive API docs at /docs (Swagger UI, which "
        "loads its scripts from a CDN); /openapi.json is served either way")
    health_check_period_s: float = Field(5.0, gt=0, description="Ray Serve health checks")
    startup_timeout_s: float = Field(
        300.0, gt=0, description="seconds `autospec serve` waits for the replicas to be ready")

    def to_args(self) -> dict[str, Any]:
        """The fields as JSON-able deployment arguments, the API key in clear (Ray hands
        them to each replica; ``model_dump`` would mask the key)."""
        args = self.model_dump(mode="json")
        args["api_key"] = self.api_key.get_secret_value() if self.api_key else None
        return args

    @field_validator("vllm_options")
    @classmethod
    def _vllm_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Refused as ``autospec serve --vllm-option`` refuses them (a replica would fail
        to start on an unknown key; one autospec sets must not be replaced)."""
        if value and info.data.get("engine") != "native":
            why = vllm_option_refusal(value)
            if why is not None:
                raise ValueError(why.removeprefix("vllm_options: "))
        return value

    @field_validator("k_bands")
    @classmethod
    def _bands(cls, value: str | None, info: ValidationInfo) -> str | None:
        bands = parse_bands(value, max_k=info.data.get("speculator_k", MAX_K))
        if bands is not None and info.data.get("engine") != "native":
            why = vllm_bands_refusal(info.data.get("vllm_options") or {})
            if why is not None:  # vLLM would drop them without a word
                raise ValueError(why)
        return None if bands is None else str(bands)

    @property
    def bands(self) -> KBands | None:
        """:attr:`k_bands` parsed (None: none)."""
        return parse_bands(self.k_bands, max_k=self.speculator_k)

    @model_validator(mode="after")
    def _replica_answers_overload(self) -> ServeConfig:
        ongoing = self.max_ongoing_requests
        if ongoing is not None and ongoing <= self.max_pending_requests:
            raise ValueError(
                f"max_ongoing_requests ({ongoing}) must exceed max_pending_requests "
                f"({self.max_pending_requests}): otherwise Ray Serve refuses overload with its "
                "own text/plain 503 before the replica can answer in the OpenAI shape")
        return self

    @field_validator("segments")
    @classmethod
    def _model_rules_name_the_served_model(cls, rules: list[SegmentRule],
                                           info: ValidationInfo) -> list[SegmentRule]:
        """A replica serves one model name and answers 404 to any other: a ``model`` rule
        naming another could never match (a segment per model is a deployment per model).
        A field check, so the error names the field (``--segment-rules`` on the command
        line); ``model_name`` and ``target`` come before it."""
        served = info.data.get("model_name") or info.data.get("target")
        for i, rule in enumerate(rules):
            if served is not None and rule.model is not None and rule.model != served:
                raise ValueError(
                    f"the rule for segment {rule.segment!r} (segments.{i}) names model "
                    f"{rule.model!r}, not the model this deployment serves ({served!r}: "
                    "model_name, else the target); a replica answers 404 to any other name, "
                    "so the rule could never match")
        return rules

    @model_validator(mode="after")
    def _default_within_the_limit(self) -> ServeConfig:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) must not exceed "
                f"max_tokens_limit ({self.max_tokens_limit}): a chat that omits max_tokens "
                "would be refused for a value it never sent")
        return self

    @model_validator(mode="after")
    def _holdout_on_native(self) -> ServeConfig:
        if self.holdout_fraction and self.engine == "vllm":
            raise ValueError(HOLDOUT_ON_VLLM)
        return self

    @property
    def ray_max_ongoing_requests(self) -> int:
        """Ray Serve's in-flight limit per replica: above the replica's pending limit, so
        every overloaded request reaches the replica and gets its OpenAI-shaped 503."""
        return self.max_ongoing_requests or 2 * self.max_pending_requests

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.target


def vllm_option_refusal(options: dict[str, Any]) -> str | None:
    """Why vLLM's engine may not take ``options``: a key autospec sets, or one vLLM's
    engine does not take (that check needs vLLM: without it, a replica's vLLM makes it)."""
    from autospec.engine.vllm.engine import engine_option_refusal, managed_option_refusal

    try:
        return engine_option_refusal(options)
    except ImportError:
        return managed_option_refusal(options)


class ServeConfigError(ValueError):
    """A Serve config (``serve_config.yaml``'s or a RayService's ``args``) that does not
    validate: every error, one line each, without the input pydantic would quote (it holds
    the API key and the database URL)."""


def checked_config(args: dict[str, Any] | None) -> ServeConfig:
    """``args`` as a :class:`ServeConfig`; :class:`ServeConfigError` naming what is wrong."""
    from pydantic import ValidationError

    from autospec.option_errors import option_errors

    try:
        return ServeConfig.model_validate(args or {})
    except ValidationError as exc:
        raise ServeConfigError("invalid autospec Serve config:\n"
                               + option_errors(exc)) from None

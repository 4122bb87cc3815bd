"""Controller policies: YAML files validated by strict pydantic models.

A policy says *when* the controller runs (``schedule``), *which traffic* a cycle uses
(``window``), *what* it trains (``training``), *how* a candidate is judged (``evaluation``
and ``gate``, the latter exactly :class:`autospec.evaluate.gate.GatePolicy`), *where* a
winner goes live besides the deployment's pointer (``promotion``: per segment), *how* a fresh
promotion is watched (``canary``) and *when* live acceptance counts as drift (``drift``).
Every model forbids unknown keys, so a typo is an error, and every error names the file and
the field (``policies/x.yaml: canary.max_shortfall: Input should be less than 1``).

Durations are strings such as ``45s``, ``30m``, ``6h``, ``2d``, ``1w``.

Shipped policies live in the top-level ``policies/`` directory (``default``,
``conservative``), installed as the ``autospec.policies`` package and found through
:func:`autospec.shipped.shipped_dir`, so they work from a checkout and from a wheel;
:func:`load_policy` takes either one of those names or a path (a name always means the
shipped policy; a file of that name in the current directory is ``./default``).
The trainable kinds and the overrides a vLLM deployment needs come from the speculator
registry. This module knows nothing of the store or scheduling.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from autospec.evaluate.gate import GatePolicy
from autospec.evaluate.speed_settings import SpeedSettings
from autospec.names import name_problem
from autospec.shipped import shipped_dir
from autospec.speculators.registry import trainable_kinds, vllm_overrides
from autospec.text_file import TextFileError, read_text_file
from autospec.threads import AUTO, ThreadSetting, resolve_threads

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class PolicyError(ValueError):
    """A policy file is missing, not YAML, or fails validation; the message names the field."""


def parse_duration(value: Any) -> timedelta:
    """``"30m"`` / ``"6h"`` / ``"2d"`` (or a number of seconds) → timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration like 45s, 30m, 6h, 2d, 1w")
        seconds = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))}).total_seconds()
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return timedelta(seconds=seconds)


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _trainable(name: str) -> str:
    if name not in (known := trainable_kinds()):
        raise ValueError(f"{name!r} is not a trainable kind; trainable kinds: {', '.join(known)}")
    return name


#: a kind the registry can train (:func:`autospec.speculators.registry.trainable_kinds`)
TrainableKind = Annotated[str, AfterValidator(_trainable)]


def _thread_setting(value: Any) -> ThreadSetting:
    if value != AUTO:
        resolve_threads(value)  # a count of at least 1, else a ValueError naming the value
    return value


#: ``auto`` or a count of torch threads (:mod:`autospec.threads`)
Threads = Annotated[ThreadSetting, BeforeValidator(_thread_setting)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Schedule(_Strict):
    """When cycles run: exactly one of ``interval`` and ``cron``."""

    interval: Duration | None = Field(None, description="run a cycle this often (e.g. 6h)")
    cron: str | None = Field(
        None, description="crontab expression (minute hour day month weekday), UTC")
    misfire_grace: Duration = Field(
        timedelta(hours=1), description="a run missed by up to this long still runs (once)")
    watch_interval: Duration = Field(
        timedelta(minutes=1), description="how often the canary / drift watch runs")

    @field_validator("cron")
    @classmethod
    def _crontab(cls, value: str | None) -> str | None:
        if value is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                trigger = CronTrigger.from_crontab(value, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a crontab expression: {exc}") from None
            if trigger.get_next_fire_time(None, datetime.now(timezone.utc)) is None:
                raise ValueError(f"{value!r} never fires: no date has that day in that "
                                 "month (a controller would run no cycle)")
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> Schedule:
        if (self.interval is None) == (self.cron is None):
            raise ValueError("give exactly one of 'interval' and 'cron'")
        return self


class Window(_Strict):
    """Which traffic a cycle snapshots."""

    min_fresh_requests: int = Field(
        200, ge=1, description="usable requests newer than the last cycle's window needed "
        "before a cycle trains anything")
    max_requests: int = Field(
        5000, ge=2, description="window size: the newest N usable requests")
    max_age: Duration | None = Field(
        None, description="ignore requests older than this, in the window and in the fresh "
        "count (None: no age limit)")
    heldout_fraction: float = Field(
        0.2, gt=0, lt=1, description="newest fraction of the window held out for evaluation, "
        "never trained on")


class Synthetic(_Strict):
    """Target-generated sequences (``autospec synth``) in training, and the overfitting guard."""

    share: float = Field(
        0.0, ge=0, le=0.9, description="share of a training window's train part made of "
        "synthetic sequences of the served target (0: none)")
    sources: list[str] | None = Field(
        None, description="only these sources (resampled, domain:<name>); null: every source")
    max_sequences: int = Field(
        2000, ge=1, description="most synthetic sequences mixed into one window")
    heldout_sequences: int = Field(
        64, ge=0, description="held-out synthetic sequences each evaluation replays beside the "
        "real held-out traffic, for the overfitting guard (0: none)")

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        for source in value or []:
            if source != "resampled" and not source.startswith("domain:"):
                raise ValueError(f"{source!r} is not a source: resampled or domain:<name>")
        return value

    def mix(self):  # type: ignore[no-untyped-def]
        """This section as a training mix (:class:`~autospec.train.data.SyntheticMix`);
        None when its share is 0."""
        from autospec.train.data import SyntheticMix

        if self.share == 0.0:
            return None
        return SyntheticMix(share=self.share, max_sequences=self.max_sequences,
                            sources=tuple(self.sources) if self.sources else None)


class Training(_Strict):
    """What a cycle trains, and its budget."""

    kinds: list[TrainableKind] = Field(
        ["suffix"], min_length=1, description="speculator kinds trained as candidates, "
        "each evaluated against the incumbent (the registry's trainable kinds)")
    epochs: int = Field(3, ge=1, le=1000, description="passes over the window (gradient kinds)")
    time_budget: Duration = Field(
        timedelta(hours=1), description="a candidate's training (features + epochs) ends "
        "when this is used up, keeping what it learnt; it is abandoned at 1.5x")
    min_train_requests: int = Field(
        50, ge=1, description="fewest training (not held-out) requests to train on")
    workers: int = Field(0, ge=0, description="0: train in the controller; N: Ray Train workers")
    use_gpu: bool = Field(
        False, description="with workers > 0: each Ray Train worker takes one GPU (as "
        "`autospec train --use-gpu`); with 0 the controller trains in its own process")
    batch_size: int = Field(8, ge=1, description="training batch size (gradient kinds)")
    from_scratch: bool = Field(
        False, description="never warm-start from the live version of the same kind")
    evaluate_base: bool = Field(
        True, description="when a candidate was warm-started from a base head (autospec "
        "pretrain; the live version is of another kind), shadow-evaluate that base as it is "
        "as well, and promote it if it passes and beats the fine-tune (one more evaluation); "
        "a base is never marked rejected")
    synthetic: Synthetic = Field(
        default_factory=Synthetic, description="synthetic sequences in training windows "
        "(autospec synth) and held out for the overfitting guard")
    engine: Literal["auto", "native", "vllm"] = Field(
        "auto", description="the engine candidates are trained for: auto follows the engine "
        "the deployment's replicas record (`autospec status`; native until one has started); "
        "vllm trains eagle3 heads as chains of k without a traffic suffix index (what vLLM "
        "runs; suffix versions run in vLLM as autospec's custom proposer); an explicit "
        "engine other than the replicas' is refused")

    @model_validator(mode="after")
    def _unique(self) -> Training:
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds are listed twice: {self.kinds}")
        if self.use_gpu and self.workers == 0:
            raise ValueError("use_gpu: true needs workers > 0 (Ray Train workers); with "
                             "workers: 0 the controller trains in its own process, on "
                             "the device it was given")
        return self

    def overrides(self, kind: str, engine: str | None = None) -> dict[str, Any]:
        """Config fields of a fresh ``kind`` candidate that the serving ``engine`` (resolved;
        default: the policy's) requires."""
        return vllm_overrides(kind) if (engine or self.engine) == "vllm" else {}


class EvaluationSpec(_Strict):
    """How candidates are shadow-evaluated."""

    k: int = Field(5, ge=1, le=16, description="draft tokens per step (match the serving k: "
                   "the canary and drift watch compare only requests served at this k)")
    speed: SpeedSettings = Field(
        default_factory=SpeedSettings, description="measured speedup: interleaved target-only "
        "vs speculative decodes of held-out prompts (autospec/evaluate/speed.py)")


class PerSegment(_Strict):
    """Promotion per traffic segment (``requests.segment``): after the deployment-wide
    decision, each segment of the held-out window with enough requests gets the candidate
    that wins on it, when that is not the version it would be served by anyway
    (:mod:`autospec.controller.segment_promotion`)."""

    enabled: bool = Field(
        True, description="move a segment's own live pointer to the candidate that wins on "
        "that segment's held-out requests (paired Δτ CI low ≥ gate.min_gain against the "
        "version serving the segment, and a segment speedup that does not fall)")
    min_requests: int = Field(
        30, ge=1, description="held-out requests of a segment needed to decide on it; "
        "smaller segments follow the deployment's pointer (or keep their own)")


class Promotion(_Strict):
    """How a cycle's passing candidates are made live beyond the deployment's pointer."""

    per_segment: PerSegment = Field(default_factory=PerSegment,
                                    description="a live pointer per traffic segment")


class Canary(_Strict):
    """Watch a fresh promotion's live acceptance against its shadow evaluation."""

    enabled: bool = Field(True, description="watch promotions and roll back on a shortfall")
    requests: int = Field(
        100, ge=1, description="live requests of the new version to judge the canary on")
    max_shortfall: float = Field(
        0.10, ge=0, lt=1, description="roll back when live τ < shadow τ × (1 − this)")
    speed_check: bool = Field(
        True, description="also judge realised speed: the new version's live tokens/s over "
        "the replaced version's before the move, against the gain the evaluation measured")
    max_speed_shortfall: float = Field(
        0.25, ge=0, lt=1, description="roll back when the realised speed gain < the measured "
        "gain × (1 − this)")


class Drift(_Strict):
    """Trigger an early cycle when live acceptance falls well below the evaluated one."""

    enabled: bool = Field(True, description="check for drift between scheduled cycles")
    window: Duration = Field(
        timedelta(hours=1), description="live τ is measured over this recent period")
    min_requests: int = Field(
        100, ge=1, description="fewest live requests in the window to judge drift on")
    max_drop: float = Field(
        0.15, gt=0, lt=1, description="drift when live τ < evaluated τ × (1 − this)")
    min_fresh_requests: int = Field(
        50, ge=1, description="fresh requests an early (drift) cycle needs")
    cooldown: Duration = Field(
        timedelta(hours=1), description="at most one early cycle per this period")


class LeaseSpec(_Strict):
    """The single-flight lease of controller work."""

    ttl: Duration = Field(
        timedelta(minutes=5), description="a dead holder's lease frees after this long "
        "(renewed every third of it while working)")


class Serving(_Strict):
    """What the controller tells the deployment's replicas about serving."""

    k_bands: str | None = Field(
        None, description="draft tokens per concurrency band the replicas follow, e.g. "
        "'1-2:5,3-:0' (0: no drafting at that load; docs/vllm.md, 'Speed at the load "
        "served'); null: each replica's own serve config")

    @field_validator("k_bands")
    @classmethod
    def _bands(cls, value: str | None) -> str | None:
        from autospec.serve.bands import MAX_K, parse_bands

        bands = parse_bands(value, max_k=MAX_K)
        return None if bands is None else str(bands)


class Policy(_Strict):
    """A retraining and promotion policy (one YAML file)."""

    name: str = Field("custom", description="shown by status and recorded with each cycle")
    description: str = Field("", description="what this policy is for")
    deployment: str = Field("default", description="the deployment whose traffic and live "
                            "pointer the controller manages")
    seed: int = Field(0, description="training seed")
    threads: Threads = Field(
        AUTO, description="torch CPU threads of a cycle's work in the controller (target "
        "load, features, in-process training, shadow replay, speed measurement) and, shared "
        "out per node, of its Ray Train workers; auto: the CPUs less one (at most torch's "
        "own count), leaving one to a replica on the same machine (autospec/threads.py); "
        "`controller --threads` overrides it")
    schedule: Schedule = Field(default_factory=lambda: Schedule(interval=timedelta(hours=6)),
                               description="when cycles run")
    window: Window = Field(default_factory=Window, description="which traffic a cycle uses")
    training: Training = Field(default_factory=Training, description="what a cycle trains")
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec,
                                       description="shadow evaluation settings")
    gate: GatePolicy = Field(default_factory=GatePolicy, description="promotion gate")
    promotion: Promotion = Field(default_factory=Promotion,
                                 description="per-segment promotion after the gate")
    canary: Canary = Field(default_factory=Canary, description="post-promotion canary watch")
    drift: Drift = Field(default_factory=Drift, description="drift trigger")
    lease: LeaseSpec = Field(default_factory=LeaseSpec, description="single-flight lease")
    serving: Serving = Field(default_factory=Serving, description="what the replicas follow "
                             "besides the live pointer")

    @field_validator("deployment")
    @classmethod
    def _deployment_name(cls, value: str) -> str:
        problem = name_problem("deployment", value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _speed_within_threads(self) -> Policy:
        speed = self.evaluation.speed.threads
        if isinstance(self.threads, int) and speed is not None and speed > self.threads:
            raise ValueError(f"evaluation.speed.threads ({speed}) exceeds threads "
                             f"({self.threads}), the cap on the controller's torch work")
        return self

    def summary(self) -> dict[str, Any]:
        """JSON-able view (durations in seconds), recorded with each cycle."""
        return self.model_dump(mode="json")


SHIPPED = ("default", "conservative")


def shipped_policy_text(name: str) -> str:
    """The YAML of a policy shipped inside the package (works from a wheel)."""
    resource = shipped_dir("policies").joinpath(f"{name}.yaml")
    if not resource.is_file():
        raise PolicyError(f"no shipped policy {name!r}; shipped: {', '.join(SHIPPED)} "
                          f"(or pass a path to a YAML file)")
    return resource.read_text(encoding="utf-8")


def load_policy(spec: str | Path = "default") -> Policy:
    """A shipped policy by name (``default``, ``conservative``) or a YAML file by path."""
    text, source = policy_text(spec)
    return parse_policy(text, source=source)


def policy_text(spec: str | Path = "default") -> tuple[str, str]:
    """The YAML text of a shipped policy or a file, and where it came from.

    A shipped name (a ``str``) always means the shipped policy, whatever the current
    directory holds: a file of that name there is read only when written as a path
    (``./default``). :class:`PolicyError` for a file that is missing, a directory, or not
    UTF-8 text."""
    if isinstance(spec, str) and spec in SHIPPED:
        return shipped_policy_text(spec), f"policies/{spec}.yaml"
    path = Path(spec)
    try:
        return read_text_file(path, "policy file"), str(path)
    except TextFileError as exc:
        shipped = "" if path.exists() else f" (shipped policies: {', '.join(SHIPPED)})"
        raise PolicyError(f"{exc}{shipped}") from None


def parse_policy(text: str, *, source: str = "<policy>") -> Policy:
    """Validate YAML text; :class:`PolicyError` naming ``source`` and each bad field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: a policy is a mapping of sections, "
                          f"not {type(data).__name__}")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_describe(source, exc)) from None


def _describe(source: str, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see policies/default.yaml)"
        lines.append(f"{source}: {field}: {message}")
    return "\n".join(lines)

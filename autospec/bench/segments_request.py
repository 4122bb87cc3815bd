"""What ``autospec bench segments`` runs with: :class:`SegmentsBenchRequest`, one model of
every setting, its defaults and what each means.

The command's options fill it (a test checks that every field has an option of the same
name, default and help). Building one checks what needs no model or data (domains, kinds):
a bad setting is a ``ValidationError`` naming it, before anything loads; held-out sets too
small for ``select_requests + eval_requests`` are refused once the traffic is logged
(:func:`check_heldout`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SegmentsBenchRequest(BaseModel):
    """The settings of one ``bench segments`` run (field descriptions are the options' help)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field("smollm2-135m", description="target: a name or a model directory")
    domains: tuple[str, ...] = Field(
        ("json", "support", "coding"), description="workload domains mixed, one segment each "
        "(two or three of support, coding, json)")
    requests: int = Field(120, ge=20, description="logged requests per domain (cached traffic)")
    max_new_tokens: int = Field(
        64, ge=8, description="output tokens per logged request and per measured decode")
    kinds: tuple[str, ...] = Field(("suffix", "eagle3"),
                                   description="kinds trained globally and per segment")
    k: int = Field(5, ge=1, description="draft tokens per step")
    epochs: int = Field(8, ge=1, description="training epochs (gradient kinds)")
    select_requests: int = Field(
        4, ge=1, description="held-out requests per domain decoded to pick the versions "
        "(the gate's measurement)")
    eval_requests: int = Field(
        8, ge=1, description="other held-out requests per domain decoded by both arms")
    draft_vocab_size: int = Field(4096, ge=2, description="eagle3 reduced vocabulary")
    ttt_steps: int = Field(3, ge=1, description="eagle3 training-time-test depth")
    dtype: str = Field("auto", description="target dtype: float32, bfloat16 or auto "
                       "(bfloat16 where the CPU has it)")
    feature_noise: float = Field(0.2, ge=0.0, description="eagle3 training feature noise")
    heldout_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="newest share of each domain's logged requests "
        "held out: never trained on, decoded to pick and to measure")
    seed: int = Field(0, description="seed of the prompts and of training")
    threads: int | None = Field(None, ge=1, description="torch threads the decodes run on "
                                "(default: this process's)")
    workdir: Path | None = Field(None, description="where the scratch store and artifacts go")
    json_path: Path | None = Field(None, description="write the figures here (a JSON file)")
    output: Path | None = Field(None, description="write the tables here as markdown")

    @field_validator("domains", "kinds", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        """``"json,support"`` (as the options take it) -> ``("json", "support")``."""
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_domains(value)
        return value

    @field_validator("kinds")
    @classmethod
    def _trainable_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_kinds(value)
        return value


def check_domains(domains: tuple[str, ...]) -> None:
    """ValueError unless ``domains`` are two or three distinct known workload domains."""
    from autospec.workloads import DOMAINS

    unknown = [d for d in domains if d not in DOMAINS]
    if unknown:
        raise ValueError(f"unknown domain {unknown[0]!r}; known domains: "
                         f"{', '.join(sorted(DOMAINS))}")
    if len(set(domains)) != len(domains) or not 2 <= len(domains) <= len(DOMAINS):
        raise ValueError(f"give 2 to {len(DOMAINS)} distinct domains, got {list(domains)}")


def check_kinds(kinds: tuple[str, ...]) -> None:
    """ValueError unless ``kinds`` are distinct trainable kinds (listing them)."""
    from autospec.speculators.registry import trainable_kinds

    known = trainable_kinds()
    bad = [k for k in kinds if k not in known]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds {list(kinds)}: give distinct trainable kinds of "
                         f"{', '.join(known)}")


class HeldoutTooSmall(ValueError):
    """A domain's held-out set holds fewer requests than the two prompt sets need."""


def check_heldout(domain: str, heldout: int, request: SegmentsBenchRequest) -> None:
    """:class:`HeldoutTooSmall` when ``domain``'s held-out set cannot give both prompt sets."""
    wanted = request.select_requests + request.eval_requests
    if heldout < wanted:
        raise HeldoutTooSmall(
            f"{domain}: {heldout} held-out requests, {wanted} wanted (--select-requests "
            f"{request.select_requests} + --eval-requests {request.eval_requests}); raise "
            f"--requests or --heldout-fraction")

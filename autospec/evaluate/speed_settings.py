"""The policy's ``evaluation.speed`` section (:class:`SpeedSettings`): how the gate's speedup
is measured. Apart from :mod:`autospec.evaluate.speed`, which measures it, so that a policy
loads without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SpeedSettings(BaseModel):
    """How the speedup is measured (the policy's ``evaluation.speed`` section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="measure the speedup by decoding (off: the gate "
                          "ranks on the estimate from τ and a cost model, and says so)")
    prompts: int = Field(4, ge=1, le=64, description="held-out prompts decoded, spread over "
                         "the held-out set")
    repeats: int = Field(2, ge=1, le=20, description="rounds per prompt (each: target-only "
                         "and every version, back to back)")
    max_tokens: int = Field(32, ge=4, le=1024, description="new tokens per decode")
    threads: int | None = Field(None, ge=1, le=1024, description="torch CPU threads the "
                                "decodes run on (default: as many as the deployment's "
                                "replicas recorded, else this process's)")
    concurrency: int | None = Field(
        None, ge=1, le=256, description="requests decoded at once when the deployment serves "
        "on vLLM (default: the median requests in flight its replicas recorded over the last "
        "day, rounded, at least 1); the native engine decodes one at a time and is measured so")
    engine: Literal["serving", "native"] = Field(
        "serving", description="serving: measure on the engine the replicas recorded (vLLM: "
        "one engine per version, batched at the served concurrency); native: autospec's "
        "engine, one request at a time, whatever the replicas run (cheaper, and blind to load)")

    def within(self, cap: int) -> SpeedSettings:
        """These settings with ``threads`` at most ``cap`` (the controller's cap on its torch
        threads, :mod:`autospec.threads`)."""
        if self.threads is None or self.threads <= cap:
            return self
        return self.model_copy(update={"threads": cap})

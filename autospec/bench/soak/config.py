"""A soak's settings (:class:`SoakConfig`), the controller policy it runs (a fast schedule,
drift watch on) and its fault schedule.

The schedule places each fault at a fraction of the run; faults run one after another, each
waiting for its moment (a training run, a passed gate) until a deadline near the run's end.
The short form (``short=True``, ≤ 5 min on a tiny target) runs the subset that fits.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: (fraction of the run, fault name, keyword arguments) — the full run
FULL_SCHEDULE: list[tuple[float, str, dict[str, float]]] = [
    (0.12, "replica_sigkill", {}),
    (0.20, "controller_sigkill_training", {}),
    (0.38, "db_locked", {"hold_s": 60.0, "at_registration": 1.0}),
    (0.48, "artifacts_read_only", {}),
    (0.60, "bad_version", {}),
    (0.70, "operator_promote_rollback", {}),
    (0.74, "operator_segment_promote_rollback", {}),
    (0.78, "controller_sigkill_gated", {}),
]
#: the short form's subset (the database lock shortened to fit)
SHORT_SCHEDULE: list[tuple[float, str, dict[str, float]]] = [
    (0.12, "replica_sigkill", {}),
    (0.25, "db_locked", {"hold_s": 20.0}),
    (0.38, "controller_sigkill_training", {}),
    (0.50, "bad_version", {}),
    (0.58, "operator_promote_rollback", {}),  # these two before the read-only fault, which
    (0.64, "operator_segment_promote_rollback", {}),  # waits for a cycle to save (a minute or
    (0.72, "artifacts_read_only", {}),                # more)
]


class SoakConfig(BaseModel):
    """What one soak runs."""

    model_config = ConfigDict(extra="forbid")

    duration_s: float = Field(1800.0, gt=0, description="seconds of traffic")
    rate: float = Field(1.0, gt=0, description="requests per second, constant")
    engine: Literal["native", "vllm"] = Field("native", description="serving engine")
    target: str = Field("smollm2-135m", description="target spec, or 'tiny' (random init)")
    dtype: str = Field("auto", description="target dtype of serve and controller")
    out: Path = Field(Path("soak-out"), description="report, logs, store and artifacts")
    max_tokens: int = Field(24, ge=1, description="tokens per request")
    k: int = Field(4, ge=1, le=16, description="draft tokens per step")
    cycle_interval_s: float = Field(240.0, gt=0, description="controller cycle interval")
    warmup_s: float = Field(120.0, ge=0, description="memory growth counts from here")
    swap_grace_s: float = Field(15.0, ge=0, description="a response may name the version "
                                "live this long before it was sent (replicas poll)")
    short: bool = Field(False, description="the short form's fault subset")
    faults: list[str] | None = Field(None, description="only these faults (default: all "
                                     "of the schedule)")
    port: int = Field(0, ge=0, description="serve's HTTP port (0: a free one)")
    kinds: list[str] = Field(default_factory=lambda: ["suffix", "eagle3"],
                             description="what the controller trains")
    startup_timeout_s: float = Field(900.0, gt=0, description="wait for serve's replicas")

    def schedule(self) -> list[tuple[float, str, dict[str, float]]]:
        base = SHORT_SCHEDULE if self.short else FULL_SCHEDULE
        return [s for s in base if self.faults is None or s[1] in self.faults]


def policy_yaml(cfg: SoakConfig) -> str:
    """The controller's policy: cycles every ``cycle_interval_s``, the watch every 10 s, a
    short lease (a killed controller's expires soon), small windows and gates."""
    return textwrap.dedent(f"""\
        name: soak
        description: the soak's fast schedule (autospec bench soak)
        schedule: {{interval: {int(cfg.cycle_interval_s)}s, watch_interval: 10s, misfire_grace: 2m}}
        window: {{min_fresh_requests: 20, max_requests: 600, heldout_fraction: 0.25}}
        training:
          kinds: [{", ".join(cfg.kinds)}]
          epochs: 1
          time_budget: 3m
          min_train_requests: 10
        evaluation:
          k: {cfg.k}
          speed: {{enabled: true, prompts: 2, repeats: 1, max_tokens: 16}}
        gate: {{min_heldout: 5, min_gain: 0.01, min_segment_requests: 1000, speedup_tolerance: 0.5}}
        canary: {{requests: 20, max_shortfall: 0.3, speed_check: false}}
        drift: {{window: 5m, min_requests: 20, max_drop: 0.3, min_fresh_requests: 20, cooldown: 3m}}
        lease: {{ttl: 30s}}
        """)

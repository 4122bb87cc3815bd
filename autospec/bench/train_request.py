"""What ``autospec bench train`` runs with: :class:`TrainBenchRequest`, one model of every
setting, its defaults and what each means.

The command's options fill it (a test checks that every field has an option of the same
name, default, help and bounds, and no option lacks a field);
:func:`~autospec.bench.train.run_train_bench` reads it. Building one checks the settings
that need no model or data (domains, variants, the synthetic share): a bad one is a
``ValidationError`` naming it, before anything loads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)


class TrainBenchRequest(BaseModel):
    """The settings of one ``bench train`` run (field descriptions are the options' help)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field("smollm2-135m", description="target: a name or a model directory")
    domain: str = Field("support", description="workload domain: support, coding or json")
    requests: int = Field(300, ge=20, description="logged requests (cached traffic)")
    max_new_tokens: int = Field(128, ge=8, description="output tokens per logged request")
    kinds: tuple[str, ...] = Field(("eagle3", "suffix", "draft"),
                                   description="kinds to train and measure")
    k: int = Field(5, ge=1, description="draft tokens per step")
    epochs: int = Field(16, ge=1, description="training epochs (eagle3, draft)")
    eval_requests: int = Field(24, ge=1, description="held-out requests decoded per method")
    draft_vocab_size: int = Field(4096, ge=2, description="eagle3 reduced vocabulary")
    ttt_steps: int = Field(3, ge=1, description="eagle3 training-time-test depth")
    dtype: str = Field("auto", description="target dtype: float32, bfloat16 or auto "
                       "(bfloat16 where the CPU has it)")
    draft_epochs: int = Field(2, ge=1, description="epochs for draft")
    feature_noise: float = Field(0.2, ge=0.0, description="eagle3 training feature noise")
    heldout_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="newest share of the logged requests held out: "
        "never trained on, decoded to measure")
    seed: int = Field(0, description="seed of the prompts (traffic, --other-domain) and of "
                      "training")
    workdir: Path | None = Field(None, description="where the scratch store and artifacts go")
    reuse: bool = Field(False, description="measure candidates already trained in --workdir "
                        "instead of training them again")
    variants: tuple[str, ...] = Field(
        ("scratch",), description="eagle3 heads side by side: scratch (today's), synthetic "
        "(resampled answers mixed in), base (the base head alone, autospec pretrain), "
        "base+finetune")
    synthetic_share: float = Field(
        0.3, description="synthetic: share of the train part that is synthetic")
    synthetic_count: int = Field(
        64, ge=1, description="sequences the target generates: resampled (synthetic), per "
        "domain (base)")
    base: Path | None = Field(None, description="an eagle3 artifact directory to use as the "
                              "base head instead of pretraining one")
    other_domain: str | None = Field(
        None, description="also decode --eval-requests prompts of this domain (none of its "
        "traffic is logged or trained on) with ngram and the variants")
    json_path: Path | None = Field(None, description="write the figures here (a JSON file)")

    @field_validator("kinds", "variants", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        """``"eagle3,suffix"`` (as the options take it) -> ``("eagle3", "suffix")``."""
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @model_validator(mode="after")
    def _checked(self) -> TrainBenchRequest:
        check_bench_input(domain=self.domain, kinds=self.kinds, variants=self.variants,
                          other_domain=self.other_domain,
                          synthetic_share=self.synthetic_share)
        return self


def check_bench_input(*, domain: str, kinds: tuple[str, ...], variants: tuple[str, ...],
                      other_domain: str | None, synthetic_share: float) -> None:
    """ValueError naming the first bad setting (before anything is loaded)."""
    from autospec.bench.segments_request import check_kinds
    from autospec.bench.train_variants import VARIANT_KIND, check_variants
    from autospec.workloads import DOMAINS

    for option, name in (("--domain", domain), ("--other-domain", other_domain)):
        if name is not None and name not in DOMAINS:
            raise ValueError(f"{option}: unknown domain {name!r}; known domains: "
                             f"{', '.join(sorted(DOMAINS))}")
    if other_domain == domain:
        raise ValueError(f"--other-domain must differ from --domain ({domain})")
    for option, check, names in (("--kinds", check_kinds, kinds),  # a misspelt kind was
                                 ("--variants", check_variants, variants)):  # found once the
        try:  # traffic had been logged
            check(names)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    if variants != ("scratch",) and VARIANT_KIND not in kinds:
        raise ValueError(f"variants {list(variants)} are {VARIANT_KIND} heads: "
                         f"add {VARIANT_KIND} to --kinds")
    if not 0.0 < synthetic_share < 1.0 and "synthetic" in variants:
        raise ValueError(f"--synthetic-share must be in (0, 1), got {synthetic_share}")

"""The explicit registry of speculator kinds: ``kind`` -> (config class, speculator class).

:func:`build_speculator` turns a config into an untrained speculator for a target (the
checkpoint loader then fills in weights); :func:`new_speculator` builds one with
defaults derived from the target. No import-time magic: adding a kind means adding a
line to :data:`SPECULATOR_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import (
    AnyConfig,
    DraftConfig,
    Eagle3Config,
    NgramConfig,
    SuffixConfig,
)
from autospec.speculators.draft import DraftSpeculator
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.ngram import NgramSpeculator
from autospec.speculators.suffix import SuffixSpeculator


@dataclass(frozen=True)
class SpeculatorKind:
    config_cls: type[AnyConfig]
    speculator_cls: type[SavableSpeculator]
    #: the kind builds transformer layers (takes the target's architecture hints)
    has_layers: bool


SPECULATOR_KINDS: dict[str, SpeculatorKind] = {
    "ngram": SpeculatorKind(NgramConfig, NgramSpeculator, has_layers=False),
    "draft": SpeculatorKind(DraftConfig, DraftSpeculator, has_layers=True),
    "eagle3": SpeculatorKind(Eagle3Config, Eagle3Speculator, has_layers=True),
    "suffix": SpeculatorKind(SuffixConfig, SuffixSpeculator, has_layers=False),
}


class UnknownSpeculatorKind(ValueError):
    """A kind not in :data:`SPECULATOR_KINDS`; the message lists the known ones."""


def speculator_kind(kind: str) -> SpeculatorKind:
    try:
        return SPECULATOR_KINDS[kind]
    except KeyError:
        known = ", ".join(sorted(SPECULATOR_KINDS))
        raise UnknownSpeculatorKind(
            f"unknown speculator kind {kind!r}; known kinds: {known}"
        ) from None


def build_speculator(config: AnyConfig, target: Target) -> SavableSpeculator:
    """An untrained (randomly initialised, deterministic) speculator of ``config``'s kind."""
    entry = speculator_kind(getattr(config, "kind", repr(type(config))))
    if not isinstance(config, entry.config_cls):
        raise TypeError(f"config of kind {config.kind!r} must be {entry.config_cls.__name__}")
    return entry.speculator_cls(config, target)  # type: ignore[call-arg]


def new_speculator(kind: str, target: Target, **overrides: Any) -> SavableSpeculator:
    """A fresh speculator of ``kind`` for ``target``: defaults from the target, then ``overrides``.

    Layered kinds take heads, MLP width, RoPE base and norm epsilon from the target's own
    config (when it has them) unless overridden.
    """
    entry = speculator_kind(kind)
    values = {**target_arch_hints(target), **overrides} if entry.has_layers else overrides
    config = entry.config_cls.for_target(target.info, **values)
    return build_speculator(config, target)


def target_arch_hints(target: Target) -> dict[str, Any]:
    """Heads, MLP width, RoPE theta and RMS epsilon of the target, where its config says."""
    cfg = target.model.config
    hints: dict[str, Any] = {}
    for ours, theirs in (("num_heads", "num_attention_heads"),
                         ("num_kv_heads", "num_key_value_heads"),
                         ("intermediate_size", "intermediate_size"),
                         ("rms_norm_eps", "rms_norm_eps")):
        value = getattr(cfg, theirs, None)
        if value is not None:
            hints[ours] = value
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(cfg, "rope_theta", None)
    if theta is not None:
        hints["rope_theta"] = float(theta)
    return hints

"""What a speculator kind declares: one :class:`Kind` per kind, exported by the kind's
module as ``KIND`` and listed once in :mod:`autospec.speculators.registry`.

Everything the rest of autospec asks of a kind is a field here, so no caller branches on a
kind's name:

- ``config`` / ``speculator`` / ``has_layers``: how a version of the kind is parsed, built
  and loaded (layered kinds take the target's architecture hints);
- ``training``: ``None`` (not trainable), :class:`GradientTraining` (a
  :class:`~autospec.speculators.training.Recipe` and the default learning rate) or
  :class:`FitTraining` (built from the window's documents, no gradient);
- ``vllm``: ``None`` (vLLM has no method for it), else :class:`VllmSupport` (the exporter
  that writes it for vLLM, refusing with :class:`ExportError` what vLLM would misread; why
  a config cannot be served on a target; the config overrides a
  vLLM-trained candidate gets, whether vLLM's proposer is seeded with the version's index);
- ``bench_variants``: the variants ``autospec bench train`` measures of the kind;
- ``shapes``: the stored tensors' shapes a config implies, checked before a version is
  built (a config's sizes are allocated then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autospec.engine.info import TargetInfo
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import KindConfig
from autospec.speculators.training import Recipe

#: (prompt ids, output ids) of each training request
Documents = list[tuple[list[int], list[int]]]


@dataclass(frozen=True)
class GradientTraining:
    """Trained by gradient through ``recipe`` (:mod:`autospec.train` runs the loop)."""

    recipe: Recipe
    lr: float  # default peak learning rate (``autospec train --lr`` overrides)


@dataclass(frozen=True)
class FitTraining:
    """Built from the window's documents, no gradient: ``fit(config, documents, target)``
    returns the speculator and its metrics (``config``: the incumbent's, or the kind's
    defaults for the target, with the request's overrides)."""

    fit: Callable[[Any, Documents, Target], tuple[SavableSpeculator, dict[str, Any]]]


class ExportError(ValueError):
    """The speculator cannot be exported; the message says why."""


@dataclass
class Exported:
    """What one exporter wrote: files (relative to ``out``), vLLM's config, notes."""

    speculative_config: dict[str, Any]
    files: list[str] = field(default_factory=list)
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


#: ``export(spec, target, out, k)``: write ``spec`` for vLLM into the empty directory ``out``
#: (:class:`ExportError` if vLLM would not run it as autospec does)
Exporter = Callable[[SavableSpeculator, Target, Path, int], Exported]


@dataclass(frozen=True)
class VllmSupport:
    """How vLLM serves the kind."""

    method: str  # vLLM's speculative method (``speculative_config["method"]``)
    export: Exporter
    #: why a config of the kind cannot be served on vLLM for a target (None: it can); None:
    #: always can
    refusal: Callable[[Any, TargetInfo], str | None] | None = None
    #: config fields of a fresh candidate trained for a vLLM deployment (policy engine vllm)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    #: vLLM's proposer starts empty: the version's index is loaded into the engine after it
    #: starts (and at each in-place swap)
    seeded_with_index: bool = False
    #: one engine's proposer holds several versions of the kind at once and drafts each
    #: request with the one it names (a segment's version beside the deployment's)
    per_request_versions: bool = False


@dataclass(frozen=True)
class Kind:
    """A speculator kind; see the module docstring."""

    name: str  # its registry line (autospec/speculators/registry.py) gives its summary
    config: type[KindConfig]
    speculator: Callable[[Any, Target], SavableSpeculator]  # its class: (config, target)
    has_layers: bool = False
    training: GradientTraining | FitTraining | None = None
    vllm: VllmSupport | None = None
    bench_variants: tuple[str, ...] = ()
    #: the shape of each stored tensor whose size a config sets without bound, checked
    #: against the weights file before a stored version is built (its sizes allocated);
    #: None: nothing to check
    shapes: Callable[[Any], dict[str, tuple[int, ...]]] | None = None

    @property
    def trainable(self) -> bool:
        return self.training is not None


def target_dir(target: Target) -> str:
    """The directory the target was loaded from (vLLM's verifier), or its id."""
    return str(getattr(target.model.config, "_name_or_path", "") or target.info.target_id)

"""The registry of speculator kinds: :data:`KINDS`, the only list of them.

Each kind's module declares a :class:`~autospec.speculators.kind.Kind` (``KIND``): its
config model, its speculator class, how it trains, how vLLM serves it. The registry lists
each kind once, in a :class:`Listed` line: the module that declares it, its one-line summary
(CLI help), whether it trains and whether one vLLM engine drafts segments with versions of
it (what ``status`` and the controller ask without loading the kind). Everything that
depends on the kinds reads it from here: config parsing (:func:`parse_config`), building
(:func:`build_speculator`, :func:`new_speculator`), training (:func:`trainable_kinds`),
export and vLLM serving (:func:`vllm_refusal`, :func:`vllm_overrides`), the CLI's choices.

A kind's module is imported the first time its declaration is asked for (:func:`kind`, or
reading :data:`KINDS`' values), not when the registry is: the kinds' modules import torch,
and the CLI's help, ``status`` and the store's commands need none of it. No import-time
magic: adding a kind means writing its module and adding its line to :data:`LISTED` (a test
adds one for its own duration with :func:`registered`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autospec.engine.info import TargetInfo
    from autospec.engine.target import Target
    from autospec.speculators.common import SavableSpeculator
    from autospec.speculators.config import KindConfig
    from autospec.speculators.kind import Kind


@dataclass(frozen=True)
class Listed:
    """A kind's line in the registry: what can be said of it without importing it."""

    module: str  # declares ``KIND``
    summary: str  # one line, for CLI help
    trainable: bool  # ``KIND.training`` is not None (checked when the module loads)
    #: one vLLM engine holds several versions of the kind, drafting each request with the one
    #: it names (``KIND.vllm.per_request_versions``, checked when the module loads)
    vllm_per_request: bool = False


#: the kinds, in the order the CLI lists them
LISTED: dict[str, Listed] = {
    "ngram": Listed("autospec.speculators.ngram",
                    "prompt lookup over the request itself (no training)", trainable=False),
    "suffix": Listed("autospec.speculators.suffix",
                     "the most frequent continuation in past traffic, an index rebuilt in "
                     "seconds", trainable=True, vllm_per_request=True),
    "draft": Listed("autospec.speculators.draft",
                    "a small causal LM on the target's vocabulary, distilled from the target",
                    trainable=True),
    "eagle3": Listed("autospec.speculators.eagle3",
                     "an EAGLE-3 head on three target layers' hidden states, with a traffic "
                     "suffix index beside it", trainable=True),
}


class UnknownSpeculatorKind(ValueError):
    """A kind not in :data:`KINDS`; the message lists the known ones."""


#: the kinds whose declaration has been read (or a test registered), by name
_LOADED: dict[str, Kind] = {}


class _Kinds(Mapping[str, "Kind"]):
    """Name → :class:`Kind` of every listed kind, each module imported on first access."""

    def __getitem__(self, name: str) -> Kind:
        if name not in _LOADED:
            _LOADED[name] = _load(name, LISTED[name])  # KeyError: not listed
        return _LOADED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(LISTED)

    def __len__(self) -> int:
        return len(LISTED)


def _load(name: str, listed: Listed) -> Kind:
    entry: Kind = importlib.import_module(listed.module).KIND
    declared = _line(entry, listed.summary, listed.module)
    if entry.name != name or declared != listed:
        raise RuntimeError(f"{listed.module}.KIND ({entry.name!r}, {declared}) does not match "
                           f"its registry line ({name!r}, {listed})")
    return entry


def _line(entry: Kind, summary: str, module: str) -> Listed:
    """The registry line ``entry`` declares (its summary and module as given)."""
    per_request = entry.vllm is not None and entry.vllm.per_request_versions
    return Listed(module, summary, trainable=entry.trainable, vllm_per_request=per_request)


#: every kind, by name (a read-only mapping; a kind's module loads when its value is read)
KINDS: Mapping[str, Kind] = _Kinds()


def kind(name: str) -> Kind:
    """The declaration of kind ``name``; :class:`UnknownSpeculatorKind` lists the known."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownSpeculatorKind(
            f"unknown speculator kind {name!r}; known kinds: {', '.join(sorted(KINDS))}"
        ) from None


def trainable_kinds() -> list[str]:
    """The kinds ``autospec train`` and the controller's policies accept, registry order."""
    return [name for name, listed in LISTED.items() if listed.trainable]


def kinds_help(names: list[str] | None = None) -> str:
    """``name (summary)`` of each kind (of ``names``), for CLI help."""
    return "; ".join(f"{n} ({LISTED[n].summary})" for n in (names or list(LISTED)))


@contextmanager
def registered(entry: Kind, summary: str) -> Iterator[Kind]:
    """``entry`` in :data:`KINDS` for the block's duration (a kind defined by a test)."""
    if entry.name in LISTED:
        raise ValueError(f"kind {entry.name!r} is already registered")
    _LOADED[entry.name] = entry  # before it is listed: a reader never imports "(registered)"
    LISTED[entry.name] = _line(entry, summary, "(registered)")
    try:
        yield entry
    finally:
        del LISTED[entry.name]
        del _LOADED[entry.name]


def parse_config(data: dict[str, Any]) -> KindConfig:
    """Validate a config dict (e.g. a checkpoint's ``config.json``) into its kind's model.

    Raises ``pydantic.ValidationError`` naming the offending field, or
    :class:`UnknownSpeculatorKind` (a ``ValueError``) listing the known kinds when ``kind``
    is missing or unknown.
    """
    name = data.get("kind") if isinstance(data, dict) else None
    return kind(str(name) if name is not None else "None").config.model_validate(data)


def build_speculator(config: KindConfig, target: Target) -> SavableSpeculator:
    """An untrained (randomly initialised, deterministic) speculator of ``config``'s kind."""
    entry = kind(getattr(config, "kind", repr(type(config))))
    if not isinstance(config, entry.config):
        raise TypeError(f"config of kind {config.kind!r} must be {entry.config.__name__}")
    return entry.speculator(config, target)


def new_speculator(name: str, target: Target, **overrides: Any) -> SavableSpeculator:
    """A fresh speculator of kind ``name`` for ``target``: defaults from the target, then
    ``overrides``.

    Layered kinds take heads, MLP width, RoPE base and norm epsilon from the target's own
    config (when it has them) unless overridden.
    """
    entry = kind(name)
    values = {**target_arch_hints(target), **overrides} if entry.has_layers else overrides
    config = entry.config.for_target(target.info, **values)
    return build_speculator(config, target)


def vllm_refusal(name: str, config: Any, info: TargetInfo) -> str | None:
    """Why a ``name`` speculator with ``config`` cannot be served on vLLM for the target of
    ``info`` (None: it can)."""
    entry = KINDS.get(name)
    if entry is None or entry.vllm is None:
        return f"a {name} version has no vLLM speculative method"
    return entry.vllm.refusal(config, info) if entry.vllm.refusal is not None else None


def vllm_overrides(name: str) -> dict[str, Any]:
    """Config fields of a fresh ``name`` candidate trained for a vLLM deployment."""
    entry = KINDS.get(name)
    return dict(entry.vllm.overrides) if entry is not None and entry.vllm is not None else {}


def vllm_seeded(name: str) -> bool:
    """Whether vLLM's proposer for a ``name`` version starts empty and is loaded with the
    version's data once its engine is up (and at each in-place swap)."""
    entry = KINDS.get(name)
    return entry is not None and entry.vllm is not None and entry.vllm.seeded_with_index


def vllm_per_request(name: str | None) -> bool:
    """Whether vLLM's proposer for ``name`` versions holds several at once, drafting each
    request with the one it names (so a segment can have a version of its own on vLLM); read
    from the registry line, so without importing the kind (or torch)."""
    listed = LISTED.get(name or "")
    return listed is not None and listed.vllm_per_request


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

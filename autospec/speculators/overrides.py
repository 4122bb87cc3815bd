"""``--set key=value``: fields of a speculator's config from the command line (``autospec
train``, ``autospec synth``, ``autospec import``), each validated by the kind's pydantic config
model (type and bounds), so a bad key or value is an error that names it (and, for a key,
lists the settable fields).

Values are YAML scalars or lists (``0.5``, ``null``, ``[2, 5, 8]``). Fields that depend on
the target too (``draft_vocab_size`` ≤ the vocabulary) are checked again when the config is
built for the target. The kind's config model comes from the registry. Knows nothing of the
store.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from autospec.speculators.registry import kind as kind_of

#: set by training from the target, the kind and the data, never from the command line
FIXED = frozenset({"kind", "target_id", "target_revision", "vocab_size", "target_vocab_size",
                   "suffix_tokens", "suffix_carried_tokens", "corpus_tokens"})


class SettingError(ValueError):
    """A ``--set`` assignment (or a stored setting) the kind's config does not take."""


def settable_fields(kind: str) -> list[str]:
    return sorted(set(kind_of(kind).config.model_fields) - FIXED)


def parse_overrides(kind: str, assignments: list[str], *,
                    allowed: Collection[str] | None = None,
                    error: type[Exception] = SettingError) -> dict[str, Any]:
    """``["tree_nodes=8", "suffix_threshold=null"]`` → validated config overrides, keys among
    ``allowed`` (default: :func:`settable_fields`); a bad one raises ``error``."""
    values: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise error(f"--set {assignment!r}: expected key=value")
        try:
            values[key] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise error(f"--set {key}={raw}: not a valid value") from None
    return validate_settings(kind, values, allowed=allowed, error=error, where="--set ")


def validate_settings(kind: str, values: Mapping[str, Any], *,
                      allowed: Collection[str] | None = None,
                      error: type[Exception] = SettingError, where: str = "") -> dict[str, Any]:
    """``values`` validated field by field by the kind's config model; keys among
    ``allowed`` (default: :func:`settable_fields`), else ``error`` naming the key."""
    fields = kind_of(kind).config.model_fields
    scope = "" if allowed is None else " this takes"
    names = settable_fields(kind) if allowed is None else sorted(allowed)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields or key not in names:
            raise error(f"{where}{key}: not a setting of {kind}{scope}; its settings"
                        f"{scope}: {', '.join(names)}")
        field = fields[key]
        shape = Annotated[(field.annotation, *field.metadata)] if field.metadata \
            else field.annotation
        try:
            out[key] = TypeAdapter(shape).validate_python(value)
        except ValidationError as exc:
            raise error(f"{where}{key}={value}: {exc.errors()[0]['msg']}") from None
    return out

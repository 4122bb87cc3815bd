"""``autospec train --set key=value``: fields of the new speculator's config from the command
line, each validated by the kind's pydantic config model (type and bounds), so a bad key or
value is an error that names it (and, for a key, lists the kind's settable fields).

Values are YAML scalars or lists (``0.5``, ``null``, ``[2, 5, 8]``). Fields that depend on
the target too (``draft_vocab_size`` ≤ the vocabulary) are checked again when the config is
built for the target. The kind's config model comes from the registry. Knows nothing of the
store.
"""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from autospec.speculators.registry import kind as kind_of
from autospec.train.errors import TrainingInputError

#: set by training from the target, the kind and the data, never from the command line
FIXED = frozenset({"kind", "target_id", "target_revision", "vocab_size", "target_vocab_size",
                   "suffix_tokens", "suffix_carried_tokens", "corpus_tokens"})


def settable_fields(kind: str) -> list[str]:
    return sorted(set(kind_of(kind).config.model_fields) - FIXED)


def parse_overrides(kind: str, assignments: list[str]) -> dict[str, Any]:
    """``["tree_nodes=8", "suffix_threshold=null"]`` → validated config overrides."""
    fields = kind_of(kind).config.model_fields
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise TrainingInputError(f"--set {assignment!r}: expected key=value")
        if key not in fields or key in FIXED:
            raise TrainingInputError(f"--set {key}: not a setting of {kind}; its settings: "
                                     f"{', '.join(settable_fields(kind))}")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise TrainingInputError(f"--set {key}={raw}: not a valid value") from None
        field = fields[key]
        shape = Annotated[(field.annotation, *field.metadata)] if field.metadata \
            else field.annotation
        try:
            overrides[key] = TypeAdapter(shape).validate_python(value)
        except ValidationError as exc:
            raise TrainingInputError(f"--set {key}={raw}: {exc.errors()[0]['msg']}") from None
    return overrides

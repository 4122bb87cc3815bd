"""``autospec train --set key=value``: :mod:`autospec.speculators.overrides` (validated by the
kind's config model), refusing as a :class:`TrainingInputError`. Knows nothing of the store.
"""

from __future__ import annotations

from typing import Any

from autospec.speculators.overrides import FIXED, settable_fields
from autospec.speculators.overrides import parse_overrides as _parse
from autospec.train.errors import TrainingInputError

__all__ = ["FIXED", "parse_overrides", "settable_fields"]


def parse_overrides(kind: str, assignments: list[str]) -> dict[str, Any]:
    """``["tree_nodes=8", "suffix_threshold=null"]`` → validated config overrides."""
    return _parse(kind, assignments, error=TrainingInputError)

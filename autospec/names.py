"""The names the store takes for versions, kinds, deployments and segments: 1-64 letters,
digits, ``.``, ``_`` or ``-``, the first a letter or digit. One rule, shared by the store,
restores, the policy and the CLI's options (which refuse a bad name before a store opens)."""

from __future__ import annotations

import re

#: the deployment a command means when none is named (a fresh store has it)
DEFAULT_DEPLOYMENT = "default"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # use fullmatch: "$" takes a final "\n"
NAME_RULE = "use 1-64 letters, digits, '.', '_' or '-'"


def is_name(value: object) -> bool:
    """Whether ``value`` is a name the store takes."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def name_problem(what: str, value: object) -> str | None:
    """Why ``value`` is not a ``what`` name (None: it is one)."""
    return None if is_name(value) else f"invalid {what} {value!r}: {NAME_RULE}"

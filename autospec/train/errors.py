"""Errors of the training package; each message says what to change.

The CLI prints ``str(error)`` without a traceback and exits non-zero.
"""

from __future__ import annotations


class TrainingError(RuntimeError):
    """A training run could not produce a candidate."""


class TrainingInputError(TrainingError, ValueError):
    """The request cannot be trained as asked (empty or too small window, bad incumbent...)."""


class EmptyWindow(TrainingInputError):
    """The window holds no usable request (none, or all opted out)."""


class WindowTooSmall(TrainingInputError):
    """The window holds fewer training requests than the policy minimum."""


class IncumbentMismatch(TrainingInputError):
    """The incumbent to warm-start from was built for another target or architecture."""


class TrainingStopped(TrainingError):
    """The run was stopped on request (``should_stop``: a deadline, a lost lease)."""

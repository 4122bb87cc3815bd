"""Errors of the training package; each message says what to change.

The base classes and :class:`IncumbentMismatch` (which a kind's recipe raises) live in
:mod:`autospec.speculators.training` and are re-exported here.
The CLI prints ``str(error)`` without a traceback and exits non-zero.
"""

from __future__ import annotations

from autospec.speculators.training import IncumbentMismatch, TrainingError, TrainingInputError

__all__ = ["ArtifactMoveError", "ArtifactWriteError", "EmptyWindow", "IncumbentMismatch",
           "StopQuestionFailed", "TrainingError", "TrainingInputError", "TrainingStopped",
           "WindowTooSmall"]


class EmptyWindow(TrainingInputError):
    """The window holds no usable request (none, or all opted out)."""


class WindowTooSmall(TrainingInputError):
    """The window holds fewer training requests than the policy minimum."""


class TrainingStopped(TrainingError):
    """The run was stopped on request (``should_stop``: a deadline, a lost lease)."""


class StopQuestionFailed(TrainingError):
    """A rank of a data-parallel group could not ask ``should_stop`` (it raised): every rank
    ends before the same step with this error, which names that rank and its error. Not a
    :class:`TrainingStopped`: nobody asked the run to stop, it failed."""


class ArtifactMoveError(TrainingError):
    """The trained candidate's artifact could not be moved to its version's directory."""


class ArtifactWriteError(TrainingError):
    """The trained candidate's artifact could not be written (its disk full, say)."""

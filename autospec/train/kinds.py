"""What training asks of a kind, read from its declaration (:mod:`autospec.speculators.registry`).

A kind trains by gradient (``Kind.training`` a
:class:`~autospec.speculators.kind.GradientTraining`: its recipe, in the kind's own module,
and default learning rate), from documents (a
:class:`~autospec.speculators.kind.FitTraining`, such as ``suffix``'s index), or not at all.
"""

from __future__ import annotations

from autospec.speculators import registry
from autospec.speculators.kind import FitTraining, GradientTraining
from autospec.speculators.training import Recipe, TrainingInputError
from autospec.speculators.training import TraineeOptions as TraineeOptions  # re-exported


def training_of(kind: str) -> GradientTraining | FitTraining:
    """How ``kind`` trains; :class:`TrainingInputError` listing the trainable kinds if not."""
    training = registry.kind(kind).training
    if training is None:
        raise TrainingInputError(f"cannot train kind {kind!r}; trainable kinds: "
                                 f"{', '.join(registry.trainable_kinds())}")
    return training


def gradient(kind: str) -> GradientTraining:
    """The recipe and default learning rate of a kind trained by gradient."""
    training = training_of(kind)
    if not isinstance(training, GradientTraining):
        raise TrainingInputError(f"kind {kind!r} is not trained by gradient")
    return training


def recipe(kind: str) -> Recipe:
    """The training recipe of a kind trained by gradient."""
    return gradient(kind).recipe

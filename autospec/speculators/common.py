"""What the speculator kinds share: the savable base class and a sampling helper."""

from __future__ import annotations

import abc

import torch

from autospec.engine.protocol import Speculator
from autospec.engine.sampling import sample
from autospec.speculators.config import AnyConfig


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One id sampled from ``probs`` (``[vocab]``), using ``generator`` on its own device."""
    assert probs.dim() == 1, f"probs must be [vocab], got {tuple(probs.shape)}"
    if generator is not None and generator.device != probs.device:
        return sample(probs.to(generator.device), generator).to(probs.device)
    return sample(probs, generator)


class SavableSpeculator(Speculator):
    """A speculator with a config and named weights, so the checkpoint module can save it.

    ``state_tensors()`` names every tensor the checkpoint holds (shapes are checked
    against a freshly built speculator on load); ``load_tensors`` takes them back and
    raises ``ValueError`` on anything it cannot accept.
    """

    config: AnyConfig

    @abc.abstractmethod
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor to store, by name (CPU or device; the saver converts)."""

    @abc.abstractmethod
    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take the stored tensors back (names and shapes already checked)."""

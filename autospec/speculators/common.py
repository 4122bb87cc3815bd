"""What the speculator kinds share: the savable base class, a sampling helper, and the
lookup of the longest n-gram ending a sequence (``ngram``'s and ``suffix``'s request index)."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TypeVar

import torch

from autospec.engine.protocol import Speculator
from autospec.engine.sampling import sample
from autospec.speculators.config import KindConfig

V = TypeVar("V")


def longest_match(index: Mapping[tuple[int, ...], V], seq: Sequence[int],
                  ns: range) -> V | None:
    """What ``index`` holds for the longest n-gram (``n`` in ``ns``) ending ``seq``, or None."""
    for n in reversed(ns):
        if n <= len(seq) and (hit := index.get(tuple(seq[-n:]))) is not None:
            return hit
    return None


def match_length(index: Mapping[tuple[int, ...], object], seq: Sequence[int],
                 ns: range) -> int:
    """The longest ``n`` in ``ns`` whose n-gram ending ``seq`` ``index`` holds; 0 if none
    (the n-gram :func:`longest_match` would read)."""
    return next((n for n in reversed(ns) if n <= len(seq) and tuple(seq[-n:]) in index), 0)


def ngrams_ending(seq: Sequence[int], ns: range) -> list[tuple[int, ...]]:
    """The n-grams (``n`` in ``ns``, at most ``len(seq)``) that end ``seq``, shortest first:
    the keys a token appended after ``seq`` continues."""
    return [tuple(seq[len(seq) - n :]) for n in ns if n <= len(seq)]


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

    config: KindConfig

    @abc.abstractmethod
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor to store, by name (CPU or device; the saver converts)."""

    @abc.abstractmethod
    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take the stored tensors back (names and shapes already checked)."""

    def hold_float32(self) -> None:
        """Hold the weights in float32 from now on, not in the target's dtype they are built
        in: training starts from them, and the stored (float32) tensors of a version loaded
        to warm-start from are then kept exactly, not rounded to bfloat16. Nothing to do for
        a kind without layers."""

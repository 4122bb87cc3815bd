"""Draft tokens per concurrency band: how many tokens a replica drafts at the load it serves.

Speculation trades spare compute for fewer target steps. With one request in flight the
target's step is memory-bound and verifying k+1 tokens costs little more than one; with a
batch the step is already busy and the drafts' verification costs real compute, so a
speculator that pays at 1 client can lose at 8 (``autospec bench serve --engine vllm
--concurrency 1,4,8`` measures where). A deployment can therefore set **bands**: ``k`` for
each range of concurrency, ``0`` meaning no drafting.

Written ``"1-2:5,3-6:3,7-:0"`` (first–last in flight, inclusive; an open last band) or as a
list of ``{"first": 1, "last": 2, "k": 5}``. The bands start at 1, follow one another
without gaps or overlaps, and end open; no band drafts more than the deployment's k.

What "concurrency" means on each engine:

- **vLLM** batches: a band is the batch size of an engine step, applied by vLLM's own
  scheduler (``speculative_config.num_speculative_tokens_per_batch_size``, :func:`vllm_schedule`);
  not with data parallelism, where vLLM drops the schedule (:func:`vllm_bands_refusal`);
- **native** decodes one request at a time on its decode thread: a band is the number of
  requests in flight on the replica when a request starts decoding (itself included). Each
  decode is a batch of one whatever the queue, so speculation's step cost does not grow with
  load there; bands still apply, as the operator wrote them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: vLLM's batch-size schedule needs a closed last range: this stands for "and beyond"
OPEN_END = 1 << 16
#: the largest k a band may name where no deployment's k bounds it (``speculator_k``'s limit)
MAX_K = 16


class BandsError(ValueError):
    """Bands that cannot be used; the message names what is wrong."""


@dataclass(frozen=True)
class Band:
    first: int
    last: int | None  # None: open (every higher concurrency)
    k: int

    def holds(self, n: int) -> bool:
        return self.first <= n and (self.last is None or n <= self.last)

    def __str__(self) -> str:
        return f"{self.first}-{'' if self.last is None else self.last}:{self.k}"


@dataclass(frozen=True)
class KBands:
    """Bands of draft tokens per concurrency (see module doc)."""

    bands: tuple[Band, ...]

    def k_for(self, concurrency: int) -> int:
        n = max(1, concurrency)
        return next(b.k for b in self.bands if b.holds(n))

    def __str__(self) -> str:
        return ",".join(str(b) for b in self.bands)

    def as_list(self) -> list[dict[str, Any]]:
        return [{"first": b.first, "last": b.last, "k": b.k} for b in self.bands]


def _parse_band(text: str) -> Band:
    span, sep, k = text.partition(":")
    first, dash, last = span.partition("-")
    try:
        if not sep or not first.strip():
            raise ValueError
        return Band(int(first), int(last) if last.strip() else (None if dash else int(first)),
                    int(k))
    except ValueError:
        raise BandsError(f"band {text.strip()!r}: write FIRST-LAST:K, e.g. '1-2:5', or "
                         "FIRST-:K for an open last band") from None


def parse_bands(value: str | list[Any] | KBands | None, *, max_k: int) -> KBands | None:
    """Bands from their text or list form (None: none); :class:`BandsError` if unusable."""
    if value is None or isinstance(value, KBands):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        bands = [_parse_band(part) for part in value.split(",")]
    else:
        try:
            bands = [Band(int(b["first"]), None if b.get("last") is None else int(b["last"]),
                          int(b["k"])) for b in value]
        except (KeyError, TypeError, ValueError) as exc:
            raise BandsError(f"bands: each needs integer 'first', 'k' and optional 'last' "
                             f"({exc})") from None
    return _checked(bands, max_k)


def _checked(bands: list[Band], max_k: int) -> KBands:
    if not bands:
        raise BandsError("bands: none given")
    expected = 1
    for b in bands:
        if b.first != expected:
            raise BandsError(f"band {b}: starts at {b.first}, expected {expected} (bands start "
                             "at 1 and follow one another without gaps or overlaps)")
        if b.last is not None and b.last < b.first:
            raise BandsError(f"band {b}: ends before it starts")
        if not 0 <= b.k <= max_k:
            raise BandsError(f"band {b}: k must be between 0 and the deployment's k ({max_k})")
        if b.last is None and b is not bands[-1]:
            raise BandsError(f"band {b}: only the last band may be open")
        expected = (b.last or 0) + 1
    if bands[-1].last is not None:
        raise BandsError(f"band {bands[-1]}: the last band must be open ('{bands[-1].first}-:"
                         f"{bands[-1].k}') so that every concurrency has a k")
    return KBands(tuple(bands))


def drafted_fewer(engine_k: int, *, k: int | None, bands: str | KBands | None, in_flight: int,
                  concurrency: float, n: int = 1) -> bool:
    """Whether a band drafted fewer than ``engine_k`` tokens a step for a request (its row's
    ``sampling.banded``): its acceptance length is then not the one its version's evaluation
    measured at k, and the canary and drift watch leave it out (:func:`autospec.store.live_tau`).

    ``k``: the k the native engine gave the whole request (its band's, at the requests in
    flight when it started). On vLLM (``k`` None) the scheduler picks k per step from the
    batch size, which a row does not record: the request counts as banded when any band up
    to the most batch rows it saw (the most requests in flight: ``in_flight`` at its start,
    its mean ``concurrency`` rounded up; its ``n`` choices are ``n`` rows of vLLM's batch)
    drafts fewer than ``engine_k``."""
    if engine_k <= 0:
        return False
    if k is not None:
        return k < engine_k
    parsed = parse_bands(bands, max_k=MAX_K)
    if parsed is None:
        return False
    peak = max(1, in_flight, math.ceil(concurrency)) + max(1, n) - 1
    return any(parsed.k_for(n) < engine_k for n in range(1, peak + 1))


def vllm_bands_refusal(options: dict[str, Any]) -> str | None:
    """Why bands cannot apply to a vLLM engine started with ``options`` (its
    ``vllm_options``); None where they can. Under data parallelism vLLM 0.32 drops the
    per-batch-size schedule with only a warning (``VllmConfig`` sets
    ``num_speculative_tokens_per_batch_size`` to None when ``data_parallel_size`` > 1: its
    ranks could pick different k and deadlock) and drafts ``num_speculative_tokens`` at
    every load, so bands would be recorded on rows that were not drafted by them."""
    try:
        ranks = int(options.get("data_parallel_size") or 1)
    except (TypeError, ValueError):  # vLLM refuses the value itself
        return None
    if ranks <= 1:
        return None
    return (f"concurrency bands cannot apply with vllm_options data_parallel_size={ranks}: "
            "vLLM drops its per-batch-size k under data parallelism and drafts "
            "num_speculative_tokens at every load (drop the bands, or data_parallel_size)")


def vllm_schedule(bands: KBands) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` for ``bands``."""
    return [(b.first, OPEN_END if b.last is None else b.last, b.k) for b in bands.bands]

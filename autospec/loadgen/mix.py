"""Domain mixes and schedules that shift the mix over time.

A **mix** maps a domain name to a weight (``support=0.7,coding=0.3``); weights need not sum
to one (they are normalised). A **schedule** is a list of ``(start second, mix)`` steps
sorted by start; the mix in force at time ``t`` is the last step whose start is ``<= t``
(the first step must start at 0). Schedules are written as
``0:support=1;120:coding=0.5,support=0.5`` or as a YAML file::

    - {at: 0, mix: {support: 1}}
    - {at: 120, mix: {coding: 1}}

This module knows nothing of HTTP or prompts; it only checks domain names against the
``known`` names it is given.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from autospec.text_file import TextFileError, read_text_file

Mix = dict[str, float]


class MixError(ValueError):
    """A mix or schedule that cannot be parsed; the message says what and where."""


def parse_mix(text: str, *, known: Iterable[str] | None = None) -> Mix:
    """``"support=0.7,coding=0.3"`` (or a bare ``"support"``) → normalised weights."""
    mix: Mix = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, weight = part.partition("=")
        name = name.strip()
        try:
            value = float(weight) if sep else 1.0
        except ValueError:
            raise MixError(f"weight of {name!r} is not a number: {weight!r}") from None
        if value < 0:
            raise MixError(f"weight of {name!r} is negative: {value}")
        mix[name] = mix.get(name, 0.0) + value
    return normalise(mix, known=known, source=text)


def normalise(mix: Mix, *, known: Iterable[str] | None = None, source: str = "") -> Mix:
    """Weights summing to 1; unknown domains and an all-zero mix are errors."""
    where = f" in {source!r}" if source else ""
    if known is not None:
        names = set(known)
        unknown = sorted(set(mix) - names)
        if unknown:
            raise MixError(f"unknown domain(s) {unknown}{where}; known: {sorted(names)}")
    total = sum(mix.values())
    if not mix or total <= 0:
        raise MixError(f"a mix needs at least one positive weight{where}")
    return {name: w / total for name, w in mix.items() if w > 0}


@dataclass(frozen=True)
class Schedule:
    """Mix steps ``(start_s, mix)``, sorted, the first at 0."""

    steps: tuple[tuple[float, Mix], ...]

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise MixError("a schedule's first step must start at 0")
        starts = [s for s, _ in self.steps]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise MixError(f"schedule steps must have increasing start times, got {starts}")

    @classmethod
    def constant(cls, mix: Mix) -> Schedule:
        return cls(((0.0, mix),))

    def mix_at(self, t: float) -> Mix:
        starts = [s for s, _ in self.steps]
        return self.steps[max(0, bisect.bisect_right(starts, t) - 1)][1]

    def pick(self, t: float, rng: random.Random) -> str:
        """A domain drawn from the mix in force at ``t``."""
        mix = self.mix_at(t)
        names = sorted(mix)
        return rng.choices(names, weights=[mix[n] for n in names])[0]

    def domains(self) -> set[str]:
        return {name for _, mix in self.steps for name in mix}

    def describe(self) -> str:
        return "; ".join(f"{start:g}s: " + ",".join(f"{n}={w:.2f}" for n, w in sorted(m.items()))
                         for start, m in self.steps)


def parse_schedule(spec: str, *, known: Iterable[str] | None = None) -> Schedule:
    """A schedule from ``"0:support=1;120:coding=1"`` or from a YAML file path."""
    known = list(known) if known is not None else None
    path = Path(spec)
    if spec.endswith((".yaml", ".yml")) or path.is_file():
        return _schedule_from_yaml(path, known)
    steps = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        start, sep, mix = part.partition(":")
        if not sep:
            raise MixError(f"schedule step {part!r} is not START:MIX (e.g. 120:coding=1)")
        steps.append((_seconds(start, part), parse_mix(mix, known=known)))
    return Schedule(tuple(steps))


def _seconds(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MixError(f"start of schedule step {where!r} is not a number of seconds") from None
    if value < 0:
        raise MixError(f"start of schedule step {where!r} is negative")
    return value


def _schedule_from_yaml(path: Path, known: list[str] | None) -> Schedule:
    try:
        data = yaml.safe_load(read_text_file(path, "schedule file"))
    except TextFileError as exc:
        raise MixError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise MixError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, list) or not data:
        raise MixError(f"{path}: a schedule is a non-empty list of {{at: SECONDS, mix: {{...}}}}")
    steps = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"at", "mix"} \
                or not isinstance(item["mix"], dict):
            raise MixError(f"{path}: step {i} must be {{at: SECONDS, mix: {{domain: weight}}}}")
        mix = {str(k): float(v) for k, v in item["mix"].items()}
        steps.append((_seconds(str(item["at"]), f"{path} step {i}"),
                      normalise(mix, known=known, source=f"{path} step {i}")))
    return Schedule(tuple(steps))

"""Durations on the command line: ``30d``, ``12h``, ``90m``, ``2w``, ``45s``.

:func:`parse_duration` reads the periods and ages the CLI's store commands take
(``--period``, ``--older-than``, ``--window``, ``--until``), where a unit is required.
:func:`parse_span` reads a run's length (``loadgen --duration``, ``bench soak --duration``),
where a bare number keeps the unit that option has always had (seconds for loadgen, minutes
for the soak) and a unit says what it means: ``--duration 2h`` is two hours on both.
Both refuse 0 and more than a century (a date before the store's first row, and one a
datetime cannot hold), and name the option; neither imports anything of autospec.
"""

from __future__ import annotations

import re
from datetime import timedelta

import typer

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_LONGEST = timedelta(days=36525)  # a century: "all of it", with room to subtract from now


def parse_duration(text: str, option: str | None = None) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` → a timedelta longer than 0; else a usage
    error naming ``option``."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 30d, 12h, 90m, 2w",
                                 param_hint=option)
    return _checked(text, match.group(2), int(match.group(1)), option)


def parse_span(text: str, option: str, bare: str) -> timedelta:
    """``2h``, ``90m``, ``45s``, or a bare number in ``bare`` (``"s"`` or ``"m"``) → a
    timedelta longer than 0; else a usage error naming ``option``."""
    match = _SPAN.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a length like 90 ({_UNITS[bare]}), 45s, "
                                 "30m or 2h", param_hint=option)
    return _checked(text, match.group(2) or bare, float(match.group(1)), option)


def _checked(text: str, unit: str, amount: float, option: str | None) -> timedelta:
    """``amount`` ``unit``s, longer than 0 and at most :data:`_LONGEST`."""
    try:
        span = timedelta(**{_UNITS[unit]: amount})
    except OverflowError:
        span = _LONGEST * 2
    if span <= timedelta(0):
        raise typer.BadParameter(f"{text!r}: a duration must be longer than 0",
                                 param_hint=option)
    if span > _LONGEST:
        raise typer.BadParameter(f"{text!r}: at most a century (36525d, 5218w)",
                                 param_hint=option)
    return span

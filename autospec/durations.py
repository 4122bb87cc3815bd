"""Durations on the command line: ``30d``, ``12h``, ``90m``, ``2w``, ``45s``.

:func:`parse_duration` reads the periods and ages the CLI's store commands take
(``--period``, ``--older-than``, ``--window``, ``--until``), where a unit is required.
:func:`parse_span` reads a run's length (``loadgen --duration``, ``bench soak --duration``),
where a bare number keeps the unit that option has always had (seconds for loadgen, minutes
for the soak) and a unit says what it means: ``--duration 2h`` is two hours on both.
Both refuse 0 and name the option; neither imports anything of autospec.
"""

from __future__ import annotations

import re
from datetime import timedelta

import typer

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str, option: str | None = None) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` → a timedelta longer than 0; else a usage
    error naming ``option``."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 30d, 12h, 90m, 2w",
                                 param_hint=option)
    return _positive(text, timedelta(**{_UNITS[match.group(2)]: int(match.group(1))}), option)


def parse_span(text: str, option: str, bare: str) -> timedelta:
    """``2h``, ``90m``, ``45s``, or a bare number in ``bare`` (``"s"`` or ``"m"``) → a
    timedelta longer than 0; else a usage error naming ``option``."""
    match = _SPAN.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a length like 90 ({_UNITS[bare]}), 45s, "
                                 "30m or 2h", param_hint=option)
    unit = match.group(2) or bare
    return _positive(text, timedelta(**{_UNITS[unit]: float(match.group(1))}), option)


def _positive(text: str, span: timedelta, option: str | None) -> timedelta:
    if span <= timedelta(0):
        raise typer.BadParameter(f"{text!r}: a duration must be longer than 0",
                                 param_hint=option)
    return span

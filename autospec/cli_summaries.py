"""One-line command summaries for the command lists of ``--help``.

Typer's rich help keeps the line breaks of a docstring's first paragraph when it lists
commands, so a summary wrapped in the source broke mid-sentence there ("… per-segment" /
"results, …"). Each command and group gets that paragraph as one line (``short_help``)
unless it sets its own; a command's own ``--help`` is unchanged.
"""

from __future__ import annotations

import inspect

import typer
from typer.models import DefaultPlaceholder


def summary(doc: str | None) -> str | None:
    """The first paragraph of ``doc`` on one line (None for no text)."""
    if not doc or not doc.strip():
        return None
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _given(value) -> str | None:
    return None if isinstance(value, DefaultPlaceholder) else value


def one_line_summaries(app: typer.Typer) -> None:
    """Set ``short_help`` on every command and group under ``app`` that has none."""
    for info in app.registered_commands:
        if info.short_help is None:
            info.short_help = summary(info.help or getattr(info.callback, "__doc__", None))
    for group in app.registered_groups:
        sub = group.typer_instance
        one_line_summaries(sub)
        if _given(group.short_help) or _given(sub.info.short_help):
            continue
        callback = sub.registered_callback
        doc = (_given(group.help) or _given(sub.info.help)
               or (callback and (_given(callback.help) or callback.callback.__doc__)))
        group.short_help = summary(doc)

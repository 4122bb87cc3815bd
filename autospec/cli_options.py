"""Options that commands of several areas share, declared once so that their names and help
agree: ``--database-url`` (alias ``--url``) on every command that opens the store.
``loadgen``'s ``--url`` is another option, the server it drives (it opens no store)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from autospec.names import name_problem
from autospec.settings import DATABASE_URL_HELP


def _name_check(what: str) -> Callable[[str | None], str | None]:
    """A Typer callback refusing a ``what`` the store would not take (exit 2 naming the
    option), before a store is opened or a model loaded."""

    def check(value: str | None) -> str | None:
        problem = None if value is None else name_problem(what, value)
        if problem:
            raise typer.BadParameter(problem)
        return value

    return check


deployment_name = _name_check("deployment")
segment_name = _name_check("segment")

DatabaseUrl = Annotated[str | None, typer.Option("--database-url", "--url",
                                                 help=DATABASE_URL_HELP)]

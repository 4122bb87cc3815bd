"""Options that commands of several areas share, declared once so that their names and help
agree: ``--database-url`` (alias ``--url``) on every command that opens the store.
``loadgen``'s ``--url`` is another option, the server it drives (it opens no store)."""

from __future__ import annotations

from typing import Annotated

import typer

from autospec.settings import DATABASE_URL_HELP

DatabaseUrl = Annotated[str | None, typer.Option("--database-url", "--url",
                                                 help=DATABASE_URL_HELP)]

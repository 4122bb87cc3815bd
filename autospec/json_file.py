"""``--json FILE`` on the commands that run for minutes (``loadgen``, ``demo``, ``bench …``;
also ``evaluate --json-path``): they print tables as they go and write their figures to a
file, where the store's commands' ``--json`` is a flag that prints JSON. A value that looks
like an option (``demo --json --quick`` would have written a file named ``--quick`` and run
the full demo), a folder that does not exist or a folder named as the file is refused before
anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def checked_json_file(value: Path | None) -> Path | None:
    """The typer callback of a ``--json FILE`` option: a usage error for a value starting
    with ``-``, a file in a folder that does not exist, or a folder."""
    if value is None:
        return None
    if str(value).startswith("-"):
        raise typer.BadParameter(f"takes the file to write the figures to, got "
                                 f"{str(value)!r} (this command writes JSON to a file; it "
                                 "prints tables as it runs)")
    if not value.parent.is_dir():
        raise typer.BadParameter(f"{value.parent} is not a directory")
    if value.is_dir():
        raise typer.BadParameter(f"{value} is a directory; name the file to write")
    return value


def json_file_option(help: str = "write the figures here (a JSON file)") -> Any:
    """A ``--json FILE`` typer option checked by :func:`checked_json_file`."""
    return typer.Option("--json", help=help, callback=checked_json_file, metavar="FILE")

"""The command lists of ``--help`` show each command's summary as one paragraph, reflowed
to the terminal, not broken where its docstring was wrapped in the source."""

from __future__ import annotations

import re
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from autospec.cli import app
from autospec.cli_summaries import summary

GROUPS = [[], ["bench"], ["controller"], ["db"]]


def _listed(args: list[str]) -> dict[str, list[str]]:
    """Command name → the lines of its summary as the list renders them, and the width
    of that column (under ``""``)."""
    out = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100"}).output
    rows: dict[str, list[str]] = {}
    name = None
    for line in out.split("Commands")[1].splitlines():
        m = re.match(r"^│ (\S*)(\s+)(.*?)\s*│$", line)
        if not m or not m[3]:
            continue
        if m[1]:
            name = m[1]
            rows[name] = []
            rows[""] = [str(len(line) - 2 - m.start(3))]
        rows[name].append(m[3])
    return rows


@pytest.mark.parametrize("args", GROUPS, ids=lambda a: " ".join(a) or "autospec")
def test_each_summary_is_its_docstrings_first_paragraph_on_one_line(args):
    command = typer.main.get_command(app)
    for word in args:
        command = command.commands[word]
    listed = _listed(args)
    width = int(listed.pop("")[0])
    assert listed.keys() == command.commands.keys()
    for name, sub in command.commands.items():
        want = summary(sub.short_help or sub.help)
        assert want and "\n" not in want, name
        assert listed[name] == textwrap.wrap(want, width), name

def test_summary_joins_the_first_paragraph_and_drops_the_rest():
    assert summary("""Do one thing,
        well.

        Details here.""") == "Do one thing, well."
    assert summary("") is None and summary(None) is None

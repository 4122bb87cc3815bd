"""An ``AUTOSPEC_*`` variable that does not parse is one line naming it and what is wrong,
exit 2, under every command that reads the settings; it was pydantic's ValidationError
traceback (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.settings import get_settings
from tests.test_cli_database_errors import OPENING, places  # noqa: F401 (a fixture)

COMMANDS = {**OPENING, "loadgen": ["loadgen", "--requests", "1"],
            "demo": ["demo", "--quick", "--out", "{tmp}/demo"]}


def _one_line(args: list[str], monkeypatch: pytest.MonkeyPatch, value: str) -> str:
    monkeypatch.setenv("AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S", value)
    get_settings.cache_clear()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_variable_is_one_line_naming_it(command: str, places: dict[str, str],  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    line = _one_line([a.format(**places) for a in COMMANDS[command]], monkeypatch, "abc")
    assert line == ("error: environment variable AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S='abc': "
                    "Input should be a valid number, unable to parse string as a number")


def test_a_value_out_of_range_says_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    line = _one_line(["status"], monkeypatch, "900")
    assert line.endswith("AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S='900': Input should be less than "
                         "or equal to 600")


def test_a_secret_variable_is_named_without_its_value() -> None:
    from pydantic import ValidationError

    from autospec.settings import Settings, _describe

    with pytest.raises(ValidationError) as info:
        Settings(api_key=["s3cret"])  # (a string always parses: only a wrong type fails)
    assert _describe(info.value).startswith("environment variable AUTOSPEC_API_KEY: ")
    assert "s3cret" not in _describe(info.value)


def test_an_empty_database_url_is_refused_not_the_local_sqlite_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``export AUTOSPEC_DATABASE_URL=$(cat /shared/autospec/database-url)`` (ops/cluster.yaml)
    with the file missing: ``db upgrade`` created the data directory's SQLite file, exit 0."""
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", "")
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert (result.exit_code, result.output.strip()) == (2, (
        "error: environment variable AUTOSPEC_DATABASE_URL='': set but empty or blank; "
        "unset it for the default, or give a value")), result.exception
    assert not (tmp_path / "autospec-data" / "autospec.db").exists()  # (conftest's data dir)

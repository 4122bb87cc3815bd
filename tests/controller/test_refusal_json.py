"""``promote --json`` and ``rollback --json`` refused (exit 3): the refusal is a JSON object
on stdout too (``outcome``, ``reason``, ``exit_code``, what was asked), as ``controller once
--json`` gives its rejection; the line on stderr stays. An operator's trial found stdout
empty, so a script reading it got nothing to parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from tests.store.test_registry import register

runner = CliRunner()


@pytest.fixture
def url(db, sqlite_url: str, tmp_path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        register(session, tmp_path, "v1")
    return ["--database-url", sqlite_url]


def _refused(args: list[str]) -> dict:
    result = runner.invoke(app, args)
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)  # one document, nothing else on stdout
    assert data["outcome"] == "refused" and data["exit_code"] == 3
    assert f"refused: {data['reason']}" in " ".join(result.stderr.split())  # the line stays
    return data


def test_promote_without_an_evaluation_refused_with_json_prints_the_refusal(url) -> None:
    data = _refused(["promote", "v1", "--json", *url])
    assert data["version"] == "v1" and data["deployment"] == "default"
    assert "no evaluation against the live version builtin-ngram" in data["reason"]
    assert "segment" not in data
    plain = runner.invoke(app, ["promote", "v1", *url])  # without --json: stdout stays empty
    assert plain.exit_code == 3 and plain.stdout == ""


def test_rollback_with_nothing_to_roll_back_refused_with_json_prints_the_refusal(url) -> None:
    data = _refused(["rollback", "--json", *url])
    assert data["deployment"] == "default" and "version" not in data
    assert "no previous version to roll back to" in data["reason"]
    unpin = _refused(["rollback", "--segment", "json", "--unpin", "--json", *url])
    assert unpin["segment"] == "json"


def test_an_error_with_json_is_still_only_a_line_on_stderr(url) -> None:
    """Exit 2 (an unknown version) prints no document, as every --json command's errors."""
    result = runner.invoke(app, ["promote", "nope", "--json", *url])
    assert result.exit_code == 2 and result.stdout == "", result.output

"""What loadgen says about failed requests, against the real app on a loopback port (tiny
target, no Ray): the counts by kind as before, and each kind's first message (the server's
own, or what the connection did) in the printed summary, the JSON and the per-request rows."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from autospec.cli import app
from autospec.loadgen import DomainSource, Driver
from autospec.loadgen.client import Result
from autospec.loadgen.runner import summarize
from autospec.ports import free_port

TOO_MANY = "max_tokens must be between 1 and 2048, got 5000"


def test_loadgen_cli_names_the_servers_message_for_each_error_kind(served, tmp_path: Path):
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, [
        "loadgen", "--url", served.url, "--requests", "2", "--max-tokens", "5000",
        "--json", str(out), "--per-request"])
    assert result.exit_code == 1, result.output
    assert f"BadRequestError 400 × 2: {TOO_MANY}" in result.output
    data = json.loads(out.read_text())
    assert data["error_kinds"] == {"BadRequestError 400": 2}  # as before: scripts read it
    assert data["error_messages"]["BadRequestError 400"].startswith(TOO_MANY)
    assert [r["error"] for r in data["results"]] == ["BadRequestError 400"] * 2
    assert all(r["error_message"].startswith(TOO_MANY) for r in data["results"])

    wrong = CliRunner().invoke(app, ["loadgen", "--url", served.url, "--requests", "1",
                                     "--model", "gpt-4", "--json", str(out)])
    assert wrong.exit_code == 1, wrong.output
    said = json.loads(out.read_text())["error_messages"]["NotFoundError 404"]
    assert "'gpt-4' does not exist" in said and said in wrong.output


def test_a_request_to_a_server_that_is_down_says_the_connection_was_refused():
    driver = Driver(f"http://127.0.0.1:{free_port()}", model="tiny", timeout_s=5)
    result = driver.send(DomainSource().next("support"))
    assert not result.ok and result.error == "APIConnectionError"
    assert result.error_message is not None and "Connection refused" in result.error_message
    summary = summarize([result], 1.0)
    assert summary["error_messages"] == {"APIConnectionError": result.error_message}


def test_messages_are_one_line_and_cut_to_the_limit():
    from autospec.loadgen.client import MESSAGE_CHARS, shorten

    assert shorten("a\n  b\tc ") == "a b c"
    long = shorten("word " * 100)
    assert len(long) == MESSAGE_CHARS and long.endswith("…") and "\n" not in long
    first = [Result(0, "a", 0, 1, False, error="X 500", error_message="first"),
             Result(1, "a", 0, 1, False, error="X 500", error_message="second")]
    assert summarize(first, 1.0)["error_messages"] == {"X 500": "first"}

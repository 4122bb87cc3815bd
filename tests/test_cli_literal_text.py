"""Text a command did not write itself (a name or path typed on the command line, an error's
message, what a server answered, a report's names) is printed as written: never read as
rich markup (``[/]`` had been a MarkupError traceback, ``[red]x`` lost its brackets) nor as
an emoji code. The controller's commands: tests/controller/test_cli_literal_text.py."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app

LONG_ACTOR = "[/]" + "x" * 200


@pytest.mark.parametrize(("args", "said"), [
    (["export", "v[/]", "--out", "{tmp}/out"], "speculator version 'v[/]' is not registered"),
    (["import", "{tmp}/no[/]dir"], "/no[/]dir: no such directory"),
    (["train", "--kind", "x[/]"], "unknown kind 'x[/]'"),
    (["evaluate", "v[/]"], "speculator version 'v[/]' is not registered"),
    (["db", "purge", "--older-than", "1d", "--actor", LONG_ACTOR],
     f"actor {LONG_ACTOR[:40]!r}… is 203 characters long"),
])
def test_an_error_naming_what_was_typed_is_one_line_as_typed(args: list[str], said: str,
                                                             sqlite_url, tmp_path,
                                                             monkeypatch) -> None:
    store.open_store(sqlite_url, upgrade=True).dispose()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    done = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert done.exit_code == 2, done.output
    assert said in done.stderr and "Traceback" not in done.output


def test_the_demos_progress_prints_a_path_as_written() -> None:
    from types import SimpleNamespace

    from autospec.demo.cli import ConsoleReporter

    buf = io.StringIO()
    reporter = ConsoleReporter(Console(file=buf, width=300), every=1)
    reporter.say("no base head read (/models/[red]x[/] :x:)")
    reporter.request(SimpleNamespace(name="A", requests=1),
                     SimpleNamespace(ok=False, tau=None, version="v[/]", tokens=0, latency_s=0.5))
    assert "no base head read (/models/[red]x[/] :x:)" in buf.getvalue()
    assert "last: failed on v[/], 0 tokens" in buf.getvalue()


def test_loadgen_prints_what_the_server_answered_as_written(capsys, monkeypatch) -> None:
    from autospec.loadgen.cli import _print

    monkeypatch.setenv("COLUMNS", "300")  # its console, made when it prints: no folded cell
    row = {"requests": 1, "tau": 2.0, "p50_ms": 10.0, "completion_tokens": 5, "straddled": 0}
    _print({"requests": 2, "errors": 1, "error_kinds": {"HTTP 500: [/] :x:": 1}, "wall_s": 1.0,
            "error_messages": {"HTTP 500: [/] :x:": "no [bold]model[/] :x:"},
            "requests_per_s": 2.0, "tokens_per_s": 5.0, "p50_ms": 10.0, "p99_ms": 12.0,
            "tau": 2.0, "straddled": 0, "ttft_p50_ms": None, "decode_tokens_per_s": None,
            "by_version": {"v[/]": row}, "by_segment": {"[red]s": row}})
    out = capsys.readouterr().out
    assert "HTTP 500: [/] :x:" in out and "v[/]" in out and "[red]s" in out
    assert "HTTP 500: [/] :x: × 1: no [bold]model[/] :x:" in out


def test_a_benchs_progress_and_goals_print_names_as_written(capsys, monkeypatch) -> None:
    from autospec.bench.progress import BenchProgress
    from autospec.bench.store import _print

    monkeypatch.setenv("COLUMNS", "300")
    buf = io.StringIO()
    BenchProgress("bench x", {}, None, Console(file=buf, width=300)).done("/m/[red]t[/] :x:")
    assert "/m/[red]t[/] :x:" in buf.getvalue()
    _print({"rows": 1, "results": {"postgresql": {"skipped": "no server [/] :x:"}},
            "goals": {"rows": {"value": 1, "goal": 2, "met": False}}})
    out = capsys.readouterr().out
    assert "skipped: no server [/] :x:" in out
    assert "goal rows: 1 vs 2 — missed" in out


def test_a_table_title_and_caption_as_written_keep_their_styles() -> None:
    """A title or caption given as Text (so that it is not read as markup) took none of
    rich's table.title / table.caption styles (italic, dim italic): plain text there."""
    from autospec.controller.ledger_view import ledger_table

    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system="standard")
    line = {"segment": "all", "requests": 1, "tokens": 2, "decode_s": 1.0, "baseline_s": 2.0,
            "saved_s": 1.0, "loop_s": 0.5, "net_s": 0.5}
    console.print(ledger_table({
        "deployment": "d[/]", "segments": [], "total": line, "period_s": 60.0, "pays": True,
        "note": None, "loop": {"stages": {}, "cycles": 1, "seconds": 0.5},
        "target_only": {"source": "holdout", "requests": 3, "tokens_per_s": 10.0}}))
    shown = console.file.getvalue()
    assert re.search(r"\x1b\[3m *ledger of d\[/\]", shown), shown  # italic, as written
    assert re.search(r"\x1b\[2;3m *last 1\.0 min", shown), shown  # the caption dim italic

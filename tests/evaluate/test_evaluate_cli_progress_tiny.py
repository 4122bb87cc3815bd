"""``autospec evaluate --json`` keeps stdout one JSON document and still says on stderr what
it is doing: the gate in force and the replay's progress (a line per tenth where stderr is
no terminal, as under a script; rich's bar on one). ``--json`` had switched the progress
off, so a script's long evaluation said nothing until it ended. Tiny random-init target,
real SQLite store, the real replay (the speed measurement off)."""

import json

from typer.testing import CliRunner

from autospec.cli import app


def test_evaluate_json_prints_progress_on_stderr_tiny_random_init(suffix_store, sqlite_url,
                                                                    tiny, monkeypatch) -> None:
    from autospec import numerics

    monkeypatch.setattr(numerics, "load_served_target", lambda *a, **kw: tiny)
    result = CliRunner().invoke(app, ["evaluate", "suffix-1", "--window", "6",
                                      "--no-speed", "--no-record", "--json",
                                      "--database-url", sqlite_url])
    assert result.exit_code in (0, 3), result.output
    data = json.loads(result.stdout)  # stdout: the document alone
    assert data["num_requests"] == 6
    assert "gate: policy 'default'" in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("shadow replay")]
    assert lines and lines[-1] == "shadow replay (requests): 6/6", result.stderr

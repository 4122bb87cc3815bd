"""``autospec evaluate``'s refusals before the target loads, and its ``--json-path`` written
after the table: a version that is already live named alone is one line (it had loaded the
target to say "a version is named twice"); a ``--json-path`` that cannot be written at the
end loses neither the table nor the gate's exit code (it had been a traceback, exit 1).
Tiny random-init target, real SQLite store."""

import shutil

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app


def _no_target(*args, **kwargs):
    raise AssertionError("the target was loaded")


@pytest.mark.parametrize(("named", "live", "said"), [
    (["suffix-1"], True, "suffix-1 is already live for default; name a version to compare it "
                         "with"),
    (["builtin-ngram"], False, "builtin-ngram drafts for default (no version is live); name a "
                               "version to compare it with"),
    (["suffix-1", "suffix-1"], False, "a version is named twice: ['suffix-1', 'suffix-1']"),
])
def test_the_live_version_or_one_named_twice_is_refused_before_the_target_loads(
        suffix_store, named, live, said, monkeypatch) -> None:
    from autospec import numerics

    if live:
        with store.session_scope(suffix_store) as session:
            store.set_live(session, version="suffix-1", actor="test", reason="test")
    monkeypatch.setattr(numerics, "load_served_target", _no_target)
    result = CliRunner().invoke(app, ["evaluate", *named, "--no-record"])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output


def test_a_json_path_that_fails_at_the_end_keeps_the_table_and_exit_code_tiny_random_init(
        suffix_store, tiny, tmp_path, monkeypatch) -> None:
    from autospec import numerics

    folder = tmp_path / "out"
    folder.mkdir()

    def load(*args, **kwargs):  # the folder goes while the evaluation runs
        shutil.rmtree(folder)
        return tiny
    monkeypatch.setattr(numerics, "load_served_target", load)
    result = CliRunner().invoke(app, ["evaluate", "suffix-1", "--window", "6", "--no-speed",
                                      "--no-record", "--json-path", str(folder / "e.json")])
    assert result.exit_code == 3, result.output  # the default gate: too few requests
    assert "decision: reject" in result.stdout and "shadow evaluation" in result.stdout
    assert f"--json-path {folder / 'e.json'}: could not write it" in result.stderr
    assert "Traceback" not in result.output


def test_a_json_path_that_fails_after_a_passing_gate_is_exit_2(tmp_path, monkeypatch) -> None:
    """A script reading exit 0 would look for a file that is not there."""
    from types import SimpleNamespace

    import typer

    from autospec.controller import evaluate_cli

    monkeypatch.setattr(evaluate_cli, "_as_json", lambda report: {"k": 1})
    monkeypatch.setattr(evaluate_cli, "_print", lambda report: None)
    for promote, code in ((True, 2), (False, 3)):
        report = SimpleNamespace(decision=SimpleNamespace(promote=promote))
        with pytest.raises(typer.Exit) as done:
            evaluate_cli._report(report, {}, json_out=False,
                                 json_path=tmp_path / "gone" / "e.json")
        assert done.value.exit_code == code
    evaluate_cli._report(SimpleNamespace(decision=SimpleNamespace(promote=True)), {},
                         json_out=False, json_path=tmp_path / "e.json")  # written: no exit
    assert (tmp_path / "e.json").is_file()

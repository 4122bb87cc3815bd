"""Usage errors found by walking the CLI as a new user would: each is exit 2 naming the
option, before any work (no server, store or model is needed to refuse them)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autospec.cli import app


@pytest.mark.parametrize(("args", "words"), [
    (["versions", "--state", "rolled-back"], "'rolled-back' is not a state; states: "),
    (["loadgen", "--url", ""], "'' is not an http:// or https:// URL with a host"),
    (["loadgen", "--url", "127.0.0.1:8000"], "is not an http:// or https:// URL"),
    (["loadgen", "--timeout", "-1"], "--timeout"),
    (["loadgen", "--requests", "-1"], "--requests"),
    (["loadgen", "--requests", "0"], "--requests"),
    (["loadgen", "--json", "/no/such/dir/summary.json"], "/no/such/dir is not a directory"),
    (["loadgen", "--json", "--per-request"], "got '--per-request'"),
    (["loadgen", "--per-request"], "--per-request: needs --json FILE"),  # had been ignored
    (["loadgen", "--replay", "/"], "Invalid value for --replay: replay file / is a directory, "
                                   "not a file"),
    # each names its option (they read 'Invalid value: ...', which of --mix, --rate... unsaid)
    (["loadgen", "--rate", "0"], "Invalid value for --rate: rate must be > 0 requests/s"),
    (["loadgen", "--mix", "support=-1"], "Invalid value for --mix: weight of 'support' is"),
    (["loadgen", "--schedule", "0:legal=1"], "Invalid value for --schedule: unknown domain"),
    (["demo", "--domain-b", "legal"], "Invalid value for --domain-b: unknown domain 'legal'"),
    (["demo", "--json", "--quick"], "'--json': takes the file to write the figures to, got "
                                    "'--quick'"),  # it had run the full demo
    (["bench", "decode", "--json", "--dtypes"], "got '--dtypes'"),
    # refused before the target loads and the baselines run (it had been a traceback after)
    (["bench", "decode", "--kinds", "ngram,eagle"], "--kinds: unknown speculator kind 'eagle'"),
    (["bench", "decode", "--dtype", "float32,float33"], "--dtype: unknown dtype 'float33'"),
    (["bench", "segments", "--json", "/no/such/dir/s.json"], "/no/such/dir is not a directory"),
    (["bench", "swap", "--json", "-"], "got '-'"),
    (["serve", "--num-cpus", "-1"], "--num-cpus"),
    (["serve", "--num-gpus", "-2"], "--num-gpus"),
    (["status", "--period", "bogus"], "Invalid value for --period: 'bogus' is not a duration"),
    (["status", "--period", "0h"], "--period: '0h': a duration must be longer than 0"),
    (["ledger", "--period", "0s"], "--period: '0s': a duration must be longer than 0"),
    (["ledger", "--until", "soon"], "Invalid value for --until"),
    # a period ending after now was accounted for as if it had happened (a trial's find)
    (["ledger", "--until", "2999-01-01T00:00"], "--until: '2999-01-01T00:00' is in the future"),
    (["ledger", "--until", "2999-01-01T00:00+05:00"], "is in the future (now is "),
    (["db", "purge", "--older-than", "0d"], "--older-than: '0d': a duration must be longer"),
    (["evaluate", "v1", "--window", "soon"], "Invalid value for --window"),
    (["evaluate", "v1", "--window", "7d:0"], "the window's request count must be at least 1"),
    # checked before the store opens and the target loads (it had failed after the replay)
    (["evaluate", "v1", "--json-path", "/no/such/dir/e.json"], "/no/such/dir is not a directory"),
    (["evaluate", "v1", "--json-path", "/"], "'--json-path': / is a directory; name the file"),
    (["loadgen", "--duration", "5 minutes"], "--duration: '5 minutes' is not a length like 90 "
                                             "(seconds), 45s"),
    (["loadgen", "--duration", "0m"], "--duration: '0m': a duration must be longer than 0"),
    (["bench", "soak", "--duration", "30s"], "--duration: '30s': a soak runs at least 1 minute"),
    (["bench", "soak", "--duration", "2x"], "is not a length like 90 (minutes)"),
    # the config model's error in the option's words, one line (it was pydantic's dump)
    (["bench", "soak", "--engine", "bogus", "--duration", "1"],
     "Invalid value: --engine: Input should be 'native' or 'vllm'"),
])
def test_a_bad_option_is_exit_2_naming_it(args: list[str], words: str, tmp_path,
                                          monkeypatch) -> None:
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())  # rich's error box, unwrapped
    assert words in text and "Traceback" not in result.output
    assert "errors.pydantic.dev" not in text  # no validation error's dump
    assert not (tmp_path / "data").exists()  # nothing created on the way


@pytest.mark.parametrize(("args", "words"), [
    (["--dtype", "float16"], "Invalid value for --dtype: unknown dtype 'float16'"),
    (["--target", "/no/such/model"], "Invalid value for --target: target '/no/such/model' is"),
])
def test_demo_refuses_a_target_or_dtype_before_ray_starts(args: list[str], words: str,
                                                          tmp_path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--quick", "--engine", "native", "--base", "none",
                                      "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert words in result.output and not out.exists()


def test_the_controller_refuses_an_unknown_dtype_on_a_store_no_replica_has_recorded(
        tmp_path, monkeypatch) -> None:
    """No replica has recorded numerics, so nothing else would check the name until a
    cycle loads the target (a cron job with the typo exited 0 until traffic came)."""
    from autospec import store

    url = f"sqlite:///{tmp_path / 'a.db'}"
    store.open_store(url, upgrade=True).dispose()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", url)
    result = CliRunner().invoke(app, ["controller", "once", "--dtype", "float16", "--json"])
    assert result.exit_code == 2, result.output
    assert "unknown dtype 'float16': use float32, bfloat16 or auto" in result.output


@pytest.mark.parametrize("command", [["train", "--kind", "suffix"], ["db", "current"],
                                     ["db", "purge", "--older-than", "30d"]])
def test_database_url_is_one_name_across_commands(command: list[str], tmp_path) -> None:
    """``--database-url`` (serve's, bench's) is taken by the commands whose option was only
    ``--url``; both names reach the same store (here: a file that does not exist)."""
    for name in ("--database-url", "--url"):
        url = f"sqlite:///{tmp_path / 'nowhere' / 'a.db'}"
        result = CliRunner().invoke(app, [*command, name, url])
        assert result.exit_code in (1, 2), result.output  # db current: 1, not ready
        assert "does not exist" in result.output or "missing" in result.output, result.output
        assert not (tmp_path / "nowhere").exists()  # a read, not a create


@pytest.mark.parametrize(("text", "bare", "seconds"), [
    ("90", "s", 90), ("90", "m", 5400), ("2h", "s", 7200), ("2h", "m", 7200), ("45s", "m", 45),
    ("1.5", "m", 90), ("1.5m", "s", 90), (" 3 m ", "s", 180),
])
def test_a_runs_length_takes_a_unit_and_a_bare_number_keeps_the_options_own(
        text: str, bare: str, seconds: float) -> None:
    """``loadgen --duration`` (bare: seconds) and ``bench soak --duration`` (bare: minutes)
    read ``2h`` alike."""
    from autospec.durations import parse_span

    assert parse_span(text, "--duration", bare).total_seconds() == seconds


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"autospec {version('autospec')}\n"


def test_dash_h_is_help_everywhere_and_serve_takes_k_as_the_other_commands_name_it() -> None:
    """``-h`` as vLLM's and Ray's CLIs take it; ``serve --k`` as ``evaluate``, ``export`` and
    ``bench`` name the draft length (``--speculator-k`` stays)."""
    import typer

    for args in (["-h"], ["status", "-h"], ["db", "purge", "-h"], ["bench", "swap", "-h"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and "Usage: autospec" in result.output, args
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    (k,) = [p for p in serve.params if p.name == "speculator_k"]
    assert set(k.opts) == {"--speculator-k", "--k"}


@pytest.mark.parametrize("option", [
    ["serve", "--segment-rules"], ["loadgen", "--replay"], ["loadgen", "--schedule"],
])
@pytest.mark.parametrize(("content", "words"), [
    (None, "is a directory, not a file"),  # "does not exist" (replay, schedule)
    (b"- caf\xe9\n", ": not UTF-8 text (invalid continuation byte at byte 5)"),  # a traceback
])
def test_a_file_option_naming_no_text_file_is_exit_2_naming_it(
        option: list[str], content: bytes | None, words: str, tmp_path, monkeypatch) -> None:
    """serve's segment rules and loadgen's replay and schedule files: a directory or a file
    that is not UTF-8 is a usage error naming the file, before anything starts."""
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "p9.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    result = CliRunner().invoke(app, [*option, str(path)])
    assert result.exit_code == 2, result.output
    text = "".join(result.output.replace("│", " ").split())  # rich's error box, unwrapped
    assert "".join(f"{path}{words}".split()) in text, result.output
    assert "Traceback" not in result.output and not (tmp_path / "data").exists()


def test_bench_swap_takes_concurrency_as_loadgen_and_bench_serve_name_it() -> None:
    """``bench swap --clients`` was the only name of the clients sending at once;
    ``--concurrency`` now, ``--clients`` kept (docs/vllm.md's measured runs use it)."""
    import typer

    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    (clients,) = [p for p in bench.commands["swap"].params if p.name == "clients"]
    assert set(clients.opts) == {"--concurrency", "--clients"}
    result = CliRunner().invoke(app, ["bench", "swap", "--concurrency", "0"])
    assert result.exit_code == 2 and "--concurrency" in result.output


def test_db_current_says_what_its_exit_status_means(tmp_path) -> None:
    """Its help said only 'Exit 0 when this code can run against it'; a missing store is
    exit 1 (a script checking it had to find that out)."""
    help_text = " ".join(CliRunner().invoke(app, ["db", "current", "--help"]).output
                         .replace("│", " ").split())
    assert "1 when it cannot (missing, empty, outdated, unknown)" in help_text
    assert "2 when the database cannot be read" in help_text
    result = CliRunner().invoke(app, ["db", "current", "--url",
                                      f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 1 and "missing" in result.output


def test_the_commands_that_exit_1_on_a_failed_run_say_so() -> None:
    """loadgen, bench swap and bench soak exit 1 when requests failed or a goal was missed;
    their help said nothing of it (docs/cli.md's header gives the convention: 0, 1, 2, 3)."""
    from pathlib import Path

    for args, words in ((["loadgen"], "Exit 0: every request succeeded; 1: some failed"),
                        (["bench", "swap"], "Exit 0; 1: some requests failed"),
                        (["bench", "soak"], "Exit 0: every goal met; 1: some missed")):
        result = CliRunner().invoke(app, [*args, "--help"])
        assert words in " ".join(result.output.replace("│", " ").split()), args
    header = (Path(__file__).parents[1] / "docs" / "cli.md").read_text().split("## ")[0]
    assert "Exit status, for scripts: 0 done; 2 a usage error" in header


@pytest.mark.parametrize("command", [
    ["status"], ["history"], ["ledger"], ["promote", "v1", "--force", "--reason", "x"],
    ["rollback"], ["evaluate", "v1"], ["train", "--kind", "suffix"], ["controller", "once"],
    ["controller", "watch"], ["controller", "run"], ["serve"], ["synth", "generate"],
])
@pytest.mark.parametrize("name", ["a b", "", "prod\n", "../prod"])
def test_a_deployment_that_is_not_a_name_is_exit_2_before_a_store_opens(
        command: list[str], name: str, tmp_path, monkeypatch) -> None:
    """The store would refuse it as a pointer's name; status, history and ledger showed an
    empty deployment and `promote --deployment ''` answered 'already live for deployment '."""
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(app, [*command, "--deployment", name])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for '--deployment': invalid deployment" in text, text
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("command", [["promote", "v1", "--force", "--reason", "x"],
                                     ["rollback"], ["history"]])
def test_a_segment_that_is_not_a_name_is_exit_2(command: list[str], tmp_path,
                                                monkeypatch) -> None:
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(app, [*command, "--segment", "team/json"])
    assert result.exit_code == 2, result.output
    assert "invalid segment 'team/json'" in " ".join(result.output.replace("│", " ").split())

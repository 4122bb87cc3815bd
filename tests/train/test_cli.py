"""``autospec train`` on a tiny random-init target: prints the version; clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autospec.cli import app


@pytest.fixture
def cli_env(monkeypatch, db_with_traffic, sqlite_url, tiny):
    import autospec.engine.target as target_module

    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr(target_module, "load_target", lambda *a, **k: tiny)
    return sqlite_url


def _run(*args: str):
    return CliRunner().invoke(app, ["train", *args])


def test_cli_train_tiny_random_init_prints_the_registered_version(cli_env) -> None:
    result = _run("--kind", "suffix", "--window", "100", "--min-requests", "5")
    assert result.exit_code == 0, result.output
    assert "registered suffix-" in result.output and "candidate" in result.output
    result = _run("--kind", "eagle3", "--window", "100", "--epochs", "1",
                  "--set", "draft_vocab_size=32", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["version"].startswith("eagle3-") and data["metrics"]["examples_seen"] > 0
    # not a terminal: a line per phase and per epoch on stderr (rich draws no bars there)
    assert "epoch 1 done: loss" in result.stderr and "training" in result.stderr
    assert data["metrics"]["suffix_tokens"] > 0  # the index over the window rides along
    result = _run("--kind", "eagle3", "--window", "100", "--epochs", "1",
                  "--set", "draft_vocab_size=32", "--set", "suffix_threshold=null", "--json")
    assert result.exit_code == 0, result.output
    assert "suffix_tokens" not in json.loads(result.stdout)["metrics"]


@pytest.mark.parametrize(("args", "message"), [
    (["--kind", "eagle3", "--window", "100", "--min-requests", "500"], "policy minimum is 500"),
    (["--kind", "medusa"], "unknown kind 'medusa'"),
    (["--kind", "eagle3", "--window", "soon"], "bad window 'soon'"),
    (["--kind", "eagle3", "--window", "100", "--incumbent", "nope-1"], "not registered"),
    (["--kind", "eagle3", "--window", "100", "--set", "draft_vocab_size=100000"],
     "draft_vocab_size"),
    (["--kind", "eagle3", "--window", "100", "--address", "127.0.0.1:1"],
     "--address needs --workers"),
    (["--kind", "draft", "--window", "100", "--set", "tree_nodes=8"],
     "--set tree_nodes: not a setting of draft; its settings: "),
    (["--kind", "eagle3", "--window", "100", "--set", "tree_nodes=100"],
     "--set tree_nodes=100: Input should be less than or equal to 64"),
    (["--kind", "eagle3", "--window", "100", "--set", "tree_nodes"],
     "--set 'tree_nodes': expected key=value"),
    (["--kind", "eagle3", "--window", "100", "--set", "kind=draft"],
     "--set kind: not a setting of eagle3"),
])
def test_cli_train_tiny_random_init_bad_input_is_one_line_without_traceback(
        cli_env, args, message) -> None:
    result = _run(*args)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_train_empty_window_is_a_clear_error(monkeypatch, tmp_path, tiny) -> None:
    import autospec.engine.target as target_module
    from autospec import store

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    store.open_store(url, upgrade=True).dispose()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", url)
    monkeypatch.setattr(target_module, "load_target", lambda *a, **k: tiny)
    result = _run("--kind", "draft")
    assert result.exit_code == 2
    assert "no usable request" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--loss", "bogus"], "--loss must be one of kl, ce, got 'bogus'"),
    (["--precision", "fp16"], "--precision must be auto, fp32 or bf16, got 'fp16'"),
    (["--lr", "0"], "the learning rate (--lr) must be a positive number, got 0.0"),
    (["--lr", "-0.001"], "the learning rate (--lr) must be a positive number, got -0.001"),
    (["--lr", "nan"], "the learning rate (--lr) must be a positive number, got nan"),
    (["--url", "bogus://x"], "cannot use database URL 'bogus://x'"),
    (["--url", "sqlite:///{tmp}/typo.db"], "typo.db does not exist"),
    (["--kind", "draft", "--loss", "ce"], "--loss ce applies to eagle3 only"),  # was ignored
])
def test_cli_train_refuses_before_any_work(monkeypatch, tmp_path, args, message) -> None:
    """Options a run reads late, and a store it cannot use, are refused up front (exit 2):
    no target is loaded and a mistyped SQLite path is not created."""
    import autospec.engine.target as target_module

    def no_load(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the target was loaded before the options were checked")

    monkeypatch.setattr(target_module, "load_target", no_load)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = _run("--kind", "eagle3", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "typo.db").exists()


def test_cli_train_tiny_random_init_reads_only_the_deployments_traffic(
        cli_env, db_with_traffic, traffic) -> None:
    """--deployment picks the traffic (window, held-out part, anchors), not only the
    incumbent: 60 requests of ``default`` and 12 of ``other``."""
    from datetime import timedelta

    from autospec import store
    from tests.train.conftest import T0

    store.write_requests(db_with_traffic, [
        store.RequestRecord(prompt_ids=p, output_ids=o, deployment="other",
                            created_at=T0 + timedelta(hours=1, seconds=i))
        for i, (p, o) in enumerate(traffic[:12])])
    result = _run("--kind", "suffix", "--window", "8", "--min-requests", "5",
                  "--deployment", "other", "--anchors", "100", "--json")
    assert result.exit_code == 0, result.output
    window = json.loads(result.stdout)["metrics"]["window"]
    assert window["train_requests"] + window["heldout_requests"] == 12  # 8 + 4 anchors
    assert window["anchor_requests"] == 4


def test_cli_train_tiny_random_init_leaves_a_directory_named_like_the_next_version(
        cli_env, db_with_traffic, monkeypatch) -> None:
    """A leftover artifact directory under the next version's name (a store reset) is kept
    as it is; the run registers the next free name. A move that fails anyway is one line,
    exit 1, no traceback."""
    from autospec import store
    from autospec.settings import get_settings

    root = get_settings().resolved_artifact_dir
    with store.session_scope(db_with_traffic, readonly=True) as session:
        name = store.next_version(session, kind="suffix")
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text("left behind")
    result = _run("--kind", "suffix", "--window", "100", "--min-requests", "5", "--json")
    assert result.exit_code == 0, result.output
    version = json.loads(result.stdout)["version"]
    assert version == name[:-4] + "0002" and (root / version / "config.json").is_file()
    assert (root / name / "config.json").read_text() == "left behind"

    monkeypatch.setattr(store, "next_version", lambda session, **_: name)  # a race, say
    result = _run("--kind", "suffix", "--window", "100", "--min-requests", "5")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"cannot move the candidate's artifact to {root / name}" in result.output
    assert (root / name / "config.json").read_text() == "left behind"


def _runs(url: str) -> int:
    from autospec import store

    engine = store.open_store(url)
    with store.session_scope(engine, readonly=True) as session:
        count = len(store.list_training_runs(session, limit=1000))
    engine.dispose()
    return count


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "feature_layers=[1, 2, 9]"], "feature_layers [9] beyond the target's 4 layers"),
    (["--set", "hidden_size=64"], "eagle3 hidden_size 64 != target's 32"),
    (["--set", "hidden_size=30"], "hidden_size (30) must be divisible by num_heads (4)"),
])
def test_cli_train_tiny_random_init_a_config_that_does_not_fit_is_refused_before_the_run(
        cli_env, args, message) -> None:
    result = _run("--kind", "eagle3", "--window", "100", "--epochs", "1", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert "the eagle3 config does not fit the target" in result.output
    assert _runs(cli_env) == 0  # refused before the run was recorded


def test_cli_train_tiny_random_init_warm_start_overrides_are_validated(cli_env) -> None:
    first = _run("--kind", "eagle3", "--window", "100", "--epochs", "1", "--json",
                 "--set", "draft_vocab_size=32", "--set", "suffix_threshold=null")
    assert first.exit_code == 0, first.output
    version = json.loads(first.stdout)["version"]
    result = _run("--kind", "eagle3", "--window", "100", "--epochs", "1",
                  "--incumbent", version, "--set", "draft_vocab_size=100000")
    assert result.exit_code == 2, result.output
    assert "draft_vocab_size (100000) must be <= target_vocab_size (64)" in result.output
    assert "Traceback" not in result.output and _runs(cli_env) == 1


def test_cli_train_an_unregistered_incumbent_is_refused_before_the_target_loads(
        monkeypatch, sqlite_url) -> None:
    """A misspelt --incumbent is bad input: exit 2 naming the option, no target loaded, no
    run recorded (it had been exit 1, after the target loaded)."""
    import autospec.engine.target as target_module
    from autospec import store

    store.open_store(sqlite_url, upgrade=True).dispose()

    def no_load(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the target was loaded before the incumbent was checked")

    monkeypatch.setattr(target_module, "load_target", no_load)
    result = _run("--kind", "eagle3", "--incumbent", "nosuch", "--url", sqlite_url)
    assert result.exit_code == 2, result.output
    assert "--incumbent: speculator version 'nosuch' is not registered" in result.output
    assert _runs(sqlite_url) == 0

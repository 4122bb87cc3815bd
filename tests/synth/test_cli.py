"""``autospec synth`` on the tiny target: progress lines, --json, one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app


@pytest.fixture
def cli_env(monkeypatch, db_with_traffic, sqlite_url, tiny):  # type: ignore[no-untyped-def]
    import autospec.engine.target as target_module

    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    monkeypatch.setattr(target_module, "load_target", lambda *a, **k: tiny)
    return db_with_traffic


def test_cli_synth_writes_rows_and_reports_them(cli_env, tiny) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, ["synth", "--count", "8", "--max-tokens", "6",
                                      "--batch-size", "4", "--temperature", "0.9"])
    assert result.exit_code == 0, result.output
    assert "resampled: 4/8 prompts answered" in result.output
    assert "8 synthetic sequences of tiny-llama-0" in result.output
    result = CliRunner().invoke(app, ["synth", "--count", "3", "--max-tokens", "6", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["written"] == 3 and data["target"]["dtype"] == "float32"
    with store.session_scope(cli_env, readonly=True) as session:
        assert sum(store.count_synthetic(session).values()) == 11


@pytest.mark.parametrize(("args", "message"), [
    (["--source", "domain:poetry"], "unknown source 'domain:poetry'"),
    (["--temperature", "0"], "resampled needs temperature > 0"),
    (["--engine", "tgi"], "unknown engine 'tgi'"),
    (["--source", "domain:support"], "has no tokenizer"),
])
def test_cli_synth_errors_are_one_line(cli_env, args, message) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, ["synth", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_cli_pretrain_registers_a_base_head(cli_env, tiny) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, ["synth", "--count", "24", "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["pretrain", "--per-domain", "0", "--epochs", "1",
                                      "--set", "draft_vocab_size=40"])
    assert result.exit_code == 0, result.output
    assert "registered base eagle3-" in result.output and "synthetic sequences" in result.output
    with store.session_scope(cli_env, readonly=True) as session:
        (row,) = store.list_speculators(session, kind="eagle3")
    assert row.meta["base"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--per-domain", "0"], "no synthetic sequences of tiny-llama-0"),
    (["--per-domain", "2"], "has no tokenizer"),
    (["--per-domain", "0", "--set", "nope=1"], "nope"),
])
def test_cli_pretrain_errors_are_one_line(cli_env, args, message) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, ["pretrain", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_cli_synth_engine_vllm_without_vllm_is_one_line(cli_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    result = CliRunner().invoke(app, ["synth", "--engine", "vllm", "--count", "2"])
    assert result.exit_code == 2, result.output
    assert "engine 'vllm' needs vLLM" in result.output and "Traceback" not in result.output

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


@pytest.mark.parametrize(("command", "args", "message"), [
    ("synth", ["--engine", "native", "--vllm-option", "enforce_eager=true"],
     "--engine native answers this run"),
    ("synth", ["--vllm-option", "enforce_eager=true"],  # auto: native on a CPU
     "the native engine answers this run (--engine auto on cpu)"),
    ("synth", ["--engine", "vllm", "--vllm-option", "seed=3"], "'seed' is set by autospec"),
    ("synth", ["--engine", "vllm", "--vllm-option", "max_model_len=64"],
     "the longest prompt + --max-tokens"),
    ("synth", ["--engine", "vllm", "--vllm-option", "dtype=half"], "'dtype' is set by autospec"),
    ("synth", ["--engine", "vllm", "--vllm-option", "enforce_eagre=true"],
     "did you mean enforce_eager"),
    ("synth", ["--engine", "vllm", "--vllm-option", "enforce_eager"], "expected KEY=VALUE"),
    ("pretrain", ["--per-domain", "1", "--engine", "native", "--vllm-option",
                  "enforce_eager=true"],
     "--engine native answers this run"),
])
def test_cli_vllm_options_vllm_would_not_take_are_refused_tiny_random_init(
        cli_env, command, args, message) -> None:  # type: ignore[no-untyped-def]
    """``--vllm-option`` (as ``autospec serve`` takes it): refused, naming the option, where
    vLLM would not start with it, synthesis sets it, or the native engine would ignore it."""
    pytest.importorskip("vllm")
    result = CliRunner().invoke(app, [command, *args, "--count", "2"] if command == "synth"
                                else [command, *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_synthesis_refuses_only_the_engine_arguments_it_sets_itself() -> None:
    """What autospec sets on a serving engine (the drafter, its worker extension, per-request
    metrics) is the user's to set for synthesis, which sets none of it; what synthesis
    sets is refused with its own reason, not a serving one."""
    pytest.importorskip("vllm")
    import typer

    from autospec.cli_options import check_engine_options
    from autospec.synth.cli import SYNTH_MANAGED

    drafting = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_max": 4},
                "per_request_spec_decode_metrics": "summary"}
    check_engine_options(drafting, SYNTH_MANAGED)  # no refusal
    with pytest.raises(typer.BadParameter, match="live pointer's version"):
        check_engine_options(drafting)  # a serving engine's
    with pytest.raises(typer.BadParameter) as refused:
        check_engine_options({"dtype": "half"}, SYNTH_MANAGED)
    assert str(refused.value) == "vllm_options: 'dtype' is set by autospec (from --dtype)"

"""``autospec serve`` options and the Serve config file (no Ray started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autospec.cli import app
from autospec.serve.config import ServeConfig
from tests.text import unwrapped

ROOT = Path(__file__).resolve().parents[2]


def test_help_explains_the_options():
    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    for option in ("--target", "--replicas", "--max-ongoing-requests", "--host", "--port",
                   "--address", "--speculator-k", "--detach", "--api-key", "AUTOSPEC_API_KEY",
                   "--docs"):
        assert option in out.output


def test_detach_needs_an_address():
    out = CliRunner().invoke(app, ["serve", "--detach"])
    assert out.exit_code != 0 and "--address" in out.output


def test_a_bad_option_value_is_a_usage_error():
    out = CliRunner().invoke(app, ["serve", "--speculation", "sometimes"])
    assert out.exit_code == 2 and "speculation" in out.output


def test_a_whole_config_check_is_a_usage_error_without_pydantics_dump():
    """A check over several fields (no option to name) reads as its message alone: not
    pydantic's dump of every option's value, which may hold an API key."""
    out = CliRunner().invoke(app, ["serve", "--engine", "vllm", "--holdout-fraction", "0.1",
                                   "--api-key", "sk-secret-key"])
    assert out.exit_code == 2 and "holdout_fraction needs the native engine" in out.output
    assert "input_value" not in out.output and "errors.pydantic.dev" not in out.output
    assert "sk-secret" not in out.output


def test_bands_with_vllm_data_parallelism_are_refused_naming_the_conflict(monkeypatch):
    """vLLM 0.32 drops the per-batch-size k under data parallelism with only a warning (its
    ``VllmConfig``): the replica would record bands on rows it drafted at its full k."""
    from autospec.bench import serve_engines
    from autospec.serve import cli as serve_cli

    def started(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("not refused: it went on to start Ray")

    monkeypatch.setattr(serve_cli, "_prepare_database", started)
    monkeypatch.setattr(serve_engines, "run_engine_bench", started)
    out = CliRunner().invoke(app, ["serve", "--engine", "vllm", "--k-bands", "1-2:5,3-:0",
                                   "--vllm-option", "data_parallel_size=2"])
    text = unwrapped(out.output)
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert "--k-bands:concurrencybandscannotapplywithvllm_optionsdata_parallel_size=2" in text
    with pytest.raises(ValueError, match="data_parallel_size=2"):  # a Serve config file
        ServeConfig.model_validate({"engine": "auto", "k_bands": "1-2:5,3-:0",
                                    "vllm_options": {"data_parallel_size": 2}})
    for fine in ({"engine": "native", "vllm_options": {"data_parallel_size": 2}},
                 {"engine": "vllm", "vllm_options": {"data_parallel_size": 1}}):
        assert ServeConfig.model_validate({**fine, "k_bands": "1-2:5,3-:0"}).k_bands
    out = CliRunner().invoke(app, ["bench", "serve", "--engine", "vllm", "--k-bands",
                                   "1-2:5,3-:0", "--vllm-option", "data_parallel_size=2"])
    assert out.exit_code == 2 and "data_parallel_size=2" in unwrapped(out.output), out.output


def test_the_serve_config_file_builds_the_application():
    config = yaml.safe_load((ROOT / "ops" / "serve_config.yaml").read_text())
    [application] = config["applications"]
    assert application["import_path"] == "autospec.serve.app:build_app"
    ServeConfig.model_validate(application["args"])  # strict: a typo would fail here
    from autospec.serve.app import build_app

    assert build_app(application["args"]) is not None


def test_a_typo_in_the_config_names_the_field():
    with pytest.raises(ValueError, match="speculater_k"):
        ServeConfig.model_validate({"speculater_k": 3})


def test_a_vllm_api_option_vllm_does_not_take_is_refused_before_serving():
    pytest.importorskip("vllm")
    out = CliRunner().invoke(app, ["serve", "--engine", "vllm",
                                   "--vllm-api-option", "tool_parser=hermes"])
    assert out.exit_code == 2 and "'tool_parser'isnotanoption" in unwrapped(out.output)


def test_a_vllm_option_vllm_s_engine_does_not_take_is_refused_before_serving():
    """Before, each replica failed to start with it and ``serve`` ended in Ray's traceback."""
    pytest.importorskip("vllm")

    def refused(*args: str) -> str:
        out = CliRunner().invoke(app, list(args))
        assert out.exit_code == 2 and "Traceback" not in out.output, out.output
        return unwrapped(out.output)

    typo = refused("serve", "--engine", "vllm", "--vllm-option", "max_model_length=2048")
    assert "'max_model_length'isnotanargument" in typo
    assert "max_model_len" in typo.split("didyoumean")[1]
    managed = refused("serve", "--engine", "vllm", "--vllm-option", "dtype=float16")
    assert "'dtype'issetbyautospec" in managed
    bench = refused("bench", "serve", "--engine", "vllm", "--vllm-option", "enforce_eagre=1")
    assert "'enforce_eagre'isnotanargument" in bench


def test_every_serve_config_field_is_an_option_with_its_default_and_help():
    """A ServeConfig field and its ``autospec serve`` option cannot drift apart: each field
    is an option with the field's default and description, or is named config-only with a
    reason (``serve.cli.CONFIG_ONLY``); options of another shape (KEY=VALUE pairs, Ray's
    resources) must exist."""
    import typer.main

    from autospec.serve.cli import CONFIG_ONLY, OPTION_OF

    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = {p.name: p for p in command.params}
    fields = ServeConfig.model_fields
    assert set(CONFIG_ONLY) <= set(fields), "CONFIG_ONLY names a field ServeConfig lacks"
    for name, field in fields.items():
        if name in CONFIG_ONLY:
            assert name not in options, f"{name} is an option and listed config-only"
            continue
        option = OPTION_OF.get(name, name)
        assert option in options, f"ServeConfig.{name} has no `autospec serve` option"
        if name in OPTION_OF and name != "startup_timeout_s":
            continue  # another shape: only its presence is checked
        assert options[option].default == field.default, f"--{option}: default"
        assert options[option].help == field.description, f"--{option}: help"


def test_the_engine_help_text_is_one_constant():
    from autospec.engine.choice import ENGINE_HELP

    assert ServeConfig.model_fields["engine"].description == ENGINE_HELP
    cli = (ROOT / "autospec" / "serve" / "cli.py").read_text()
    assert "vLLM's async engine" not in cli  # written once, in autospec.engine.choice


def test_a_port_another_process_holds_is_refused_before_ray_starts():
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert out.exit_code == 2 and f"127.0.0.1:{port} is already in use" in out.output


def test_a_failed_deployment_is_said_with_the_replicas_last_error_line(monkeypatch, capsys):
    """Serve's RuntimeError after every replica start failed (a vLLM engine without room for
    its KV cache, say) ends ``serve`` with the error and the replicas' cause, not a
    traceback; Serve's status is read as Ray 2 gives it (applications → deployments)."""
    from types import SimpleNamespace

    from ray import serve

    from autospec.serve.cli import _deploy_failed

    message = ("The deployment failed to start 3 times in a row.\nTraceback (most recent call "
               "last):\n  File \"x.py\", line 1\nVersionLoadError: version 'builtin-ngram': vLLM "
               "could not start with it: ValueError: No available memory for the cache blocks\n")
    status = SimpleNamespace(applications={"autospec": SimpleNamespace(deployments={
        "AutospecServer": SimpleNamespace(message=message)})})
    monkeypatch.setattr(serve, "status", lambda: status)
    code = _deploy_failed(RuntimeError("Deploying application autospec failed"), "autospec")
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: Deploying application autospec failed")
    assert err.rstrip().endswith("a replica failed to start: VersionLoadError: version "
                                 "'builtin-ngram': vLLM could not start with it: ValueError: "
                                 "No available memory for the cache blocks")
    monkeypatch.setattr(serve, "status", lambda: (_ for _ in ()).throw(
        ConnectionError("Ray is down")))
    assert _deploy_failed(RuntimeError("x"), "autospec") == 1  # no status: the error alone
    assert capsys.readouterr().err == "error: x\n"

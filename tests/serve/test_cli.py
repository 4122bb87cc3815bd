"""``autospec serve`` options and the Serve config file (no Ray started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autospec.cli import app
from autospec.serve.config import ServeConfig

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
    assert out.exit_code == 2 and "'tool_parser' is not an option" in out.output

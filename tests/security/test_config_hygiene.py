"""Configuration an operator hands over as their tooling writes it: empty variables, a
blank key, a password with an '@', a RayService whose args do not validate, a machine-wide
AUTOSPEC_EXPOSE_RAY. Each is read as meant, or refused without quoting a secret."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from autospec.settings import get_settings


@pytest.fixture
def fresh_settings():  # type: ignore[no-untyped-def]
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.parametrize("name", ["AUTOSPEC_DATABASE_URL", "AUTOSPEC_DATA_DIR",
                                  "AUTOSPEC_ARTIFACT_DIR", "AUTOSPEC_SPILL_DIR",
                                  "AUTOSPEC_CACHE_DIR", "AUTOSPEC_API_KEY_FILE"])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_store_or_path_variable_is_refused_not_a_default_nor_the_cwd(
        fresh_settings, monkeypatch, tmp_path, name: str, empty: str) -> None:
    """Unset, each means a local default: set but empty (``$(cat FILE)`` of a missing file)
    it had meant that default too without a word (a node's own SQLite file, its own
    artifact folder), and before that the current directory."""
    from autospec.settings import SettingsError

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(name, empty)
    with pytest.raises(SettingsError) as got:
        get_settings()
    assert str(got.value) == (f"environment variable {name}={empty!r}: set but empty or "
                              "blank; unset it for the default, or give a value")


def test_an_empty_api_key_variable_is_no_key(fresh_settings, monkeypatch) -> None:
    """Keys are not where anything lives: an empty AUTOSPEC_API_KEY is no key, as a blank
    explicit one is (docs/security.md), so the key file still applies."""
    from autospec.settings import api_keys

    monkeypatch.setenv("AUTOSPEC_API_KEY", "")
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    assert api_keys() == ()


@pytest.mark.parametrize("blank", [" ", ",", " , "])
def test_a_blank_explicit_key_leaves_the_environments_key_in_force(
        fresh_settings, monkeypatch, blank) -> None:
    """A template's unset variable (``api_key: " "``) had turned authentication off, the
    environment's key notwithstanding."""
    from autospec.serve.auth import configured_keys

    monkeypatch.setenv("AUTOSPEC_API_KEY", "envkey-123")
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    ring = configured_keys(SecretStr(blank))
    assert ring is not None and ring.keys() == ("envkey-123",)
    assert configured_keys(SecretStr("mine")).keys() == ("mine",)


def test_a_serve_config_that_does_not_validate_quotes_no_secret() -> None:
    """Ray Serve shows the error as the application's status (`serve status`, a
    RayService's): pydantic's own text quoted the input, API key and database URL in it."""
    from autospec.serve.config import ServeConfigError, checked_config

    with pytest.raises(ServeConfigError) as got:
        checked_config({"api_key": "sk-VERYSECRET", "max_ongoing_requests": 10,
                        "database_url": "postgresql://u:hunter2@db/x"})
    text = str(got.value)
    assert "max_ongoing_requests" in text
    assert "VERYSECR" not in text and "hunter2" not in text and "input_value" not in text


def test_an_at_sign_in_a_database_password_is_refused_without_its_tail() -> None:
    from autospec.store.db import BadDatabaseURL, parse_url

    with pytest.raises(BadDatabaseURL) as got:
        parse_url("postgresql+psycopg://u:S3cr@tPw@127.0.0.1:5432/db")
    text = str(got.value)
    assert "%40" in text and "S3cr" not in text and "tPw" not in text
    assert parse_url("postgresql+psycopg://u:S3cr%40tPw@127.0.0.1:5432/db").password == "S3cr@tPw"


def _deploy_sees(monkeypatch, args: list[str], env: dict[str, str]) -> tuple[Any, dict]:
    from autospec.cli import app
    from autospec.serve import cli

    seen: dict = {}

    def deploy(config, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        raise KeyboardInterrupt  # stop before anything starts

    monkeypatch.setattr(cli, "deploy", deploy)
    monkeypatch.setattr(cli, "_check_port", lambda *a, **k: None)
    return CliRunner().invoke(app, ["serve", *args], env=env), seen


def test_a_machine_wide_expose_ray_does_not_stop_a_cluster_deploy(monkeypatch) -> None:
    """AUTOSPEC_EXPOSE_RAY set on a head (for its local Rays) had made `serve --address`
    refuse, naming a flag nobody gave; the flag itself is still refused there."""
    _, seen = _deploy_sees(monkeypatch, ["--address", "auto", "--detach"],
                           {"AUTOSPEC_EXPOSE_RAY": "1"})
    assert seen and seen["expose_ray"] is False and seen["address"] == "auto"
    result, seen = _deploy_sees(monkeypatch, ["--address", "auto", "--expose-ray"], {})
    assert result.exit_code == 2 and not seen
    assert "--expose-ray is for the local Ray" in result.output


def test_no_cluster_at_the_address_is_exit_2_naming_it(monkeypatch) -> None:
    import ray

    from autospec.serve import cli

    def no_cluster(**kwargs: Any) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", no_cluster)
    with pytest.raises(Exception) as got:
        cli.deploy(None, host="127.0.0.1", port=1, address="auto")  # type: ignore[arg-type]
    assert "--address" in str(got.value.param_hint)  # a usage error, not a traceback
    assert "Could not find any running Ray instance" in str(got.value)

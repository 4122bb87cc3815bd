"""One settings object for the whole process, read from ``AUTOSPEC_*`` environment variables.

| variable | default |
|---|---|
| ``AUTOSPEC_DATA_DIR`` | ``~/.autospec`` |
| ``AUTOSPEC_DATABASE_URL`` | ``sqlite:///<data dir>/autospec.db`` |
| ``AUTOSPEC_ARTIFACT_DIR`` | ``<data dir>/artifacts`` |
| ``AUTOSPEC_SPILL_DIR`` | ``<data dir>/spill`` (traffic rows waiting for the database) |
| ``AUTOSPEC_CACHE_DIR`` | ``$XDG_CACHE_HOME/autospec``, else ``~/.cache/autospec`` |
| ``AUTOSPEC_API_KEY`` | none (no authentication); the Bearer key(s) ``serve`` requires, a,b |
| ``AUTOSPEC_API_KEY_FILE`` | none; a file of keys, one per line, re-read when it changes |
| ``AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S`` | 0; crash drills: a cycle's wait from gate to promotion |

A variable that does not parse (``AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S=abc``) is a
:class:`SettingsError` naming it and what is wrong; every command prints it as one line.
So is a variable of :data:`NOT_BLANK` set but empty or blank: unset, each means a local
default (the SQLite file in the data directory, ``~/.autospec``), so an empty one — a
``$(cat FILE)`` of a missing file, a template's unset value — would point a cluster's
node at a store or folder of its own without a word. An empty ``AUTOSPEC_API_KEY`` is no
key (:func:`api_keys`); an empty ``AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S`` is not a number.

The cache holds only what can be derived again (a GGUF target dequantized to
safetensors); it is machine-wide, like Hugging Face's, so every data directory shares it.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DATABASE_URL_HELP = ("database URL (default: AUTOSPEC_DATABASE_URL, else the SQLite file "
                     "autospec.db in AUTOSPEC_DATA_DIR)")
"""The help of every command's ``--database-url`` (and ``ServeConfig.database_url``)."""

NOT_BLANK = ("data_dir", "database_url", "artifact_dir", "cache_dir", "spill_dir",
             "api_key_file")
"""Settings whose variable, set, must hold something: where the store and files live."""


class Settings(BaseSettings):
    """Process-wide settings; see the module docstring for the variables."""

    model_config = SettingsConfigDict(env_prefix="AUTOSPEC_", extra="ignore")

    data_dir: Path = Field(
        default_factory=lambda: Path.home() / ".autospec",
        description="where the SQLite database, artifacts and caches live by default",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default a SQLite file in the data directory"
    )
    artifact_dir: Path | None = Field(
        default=None, description="where speculator artifacts are written"
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "autospec",
        description="machine-wide cache of derived files (dequantized GGUF targets)",
    )
    spill_dir: Path | None = Field(
        default=None,
        description="where the traffic writer spills rows while the database is unreachable",
    )

    api_key: SecretStr | None = Field(
        default=None, description="API key(s) the serving application requires (Bearer), "
        "comma-separated; clients of this package send the first")
    api_key_file: Path | None = Field(
        default=None, description="a file of API keys, one per line ('#' comments), that "
        "replicas re-read when it changes; clients send its first key when api_key is unset")

    cycle_hold_after_gate_s: float = Field(
        default=0.0, ge=0.0, le=600.0,
        description="crash drills only (autospec bench soak): seconds a controller's cycle "
        "waits, holding its lease, between a candidate passing its gate and the promotion, so "
        "a fault can kill it there; on the native engine that moment is otherwise milliseconds")

    @field_validator(*NOT_BLANK, mode="before")
    @classmethod
    def _not_blank(cls, value: object) -> object:
        """Set but empty is refused, not read as unset (see the module docstring)."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("set but empty or blank; unset it for the default, or give a value")
        return value

    @field_validator("data_dir", "artifact_dir", "cache_dir", "spill_dir", "api_key_file")
    @classmethod
    def _home(cls, path: Path | None) -> Path | None:
        """``~`` is the home folder, as a shell would read it (a Dockerfile's ``ENV`` or a
        ``.env`` file hands it over unexpanded)."""
        return path.expanduser() if path is not None else None

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'autospec.db'}"

    @property
    def resolved_artifact_dir(self) -> Path:
        return self.artifact_dir or self.data_dir / "artifacts"

    @property
    def resolved_spill_dir(self) -> Path:
        return self.spill_dir or self.data_dir / "spill"


def api_key() -> str | None:
    """The key this package's clients send: the first of ``AUTOSPEC_API_KEY``, else the first
    of ``AUTOSPEC_API_KEY_FILE``; None when neither holds one (no authentication). The
    applications ``demo`` and ``bench serve`` deploy require it."""
    keys = api_keys()
    return keys[0] if keys else None


def api_keys() -> tuple[str, ...]:
    """Every key of ``AUTOSPEC_API_KEY``, else of ``AUTOSPEC_API_KEY_FILE`` (an unreadable
    file: none)."""
    settings = get_settings()
    if settings.api_key is not None and settings.api_key.get_secret_value().strip():
        return parse_keys(settings.api_key.get_secret_value())
    if settings.api_key_file is not None:
        try:
            return parse_keys(settings.api_key_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return ()
    return ()


def parse_keys(text: str) -> tuple[str, ...]:
    """Keys in a variable or a key file: separated by commas or new lines; blank entries and
    lines starting with ``#`` are skipped; order kept, duplicates dropped."""
    keys: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        for key in (part.strip() for part in line.split(",")):
            if key and key not in keys:
                keys.append(key)
    return tuple(keys)


class SettingsError(ValueError):
    """An ``AUTOSPEC_*`` variable holds a value its setting cannot take; the message names
    each such variable and what is wrong (the CLI prints it as one line, exit 2)."""


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once; tests call ``get_settings.cache_clear()``);
    :class:`SettingsError` for a variable that does not parse."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """``AUTOSPEC_X='abc': Input should be a valid number, ...``, one per bad variable (the
    value is left out of a secret's)."""
    problems = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "?"
        name = f"{Settings.model_config.get('env_prefix', '')}{field}".upper()
        info = Settings.model_fields.get(field)
        secret = info is not None and "SecretStr" in str(info.annotation)
        value = "" if secret else f"={error.get('input')!r}"
        cause = (error.get("ctx") or {}).get("error")  # a validator's own ValueError: its
        message = str(cause) if error["type"] == "value_error" and cause else error["msg"]
        problems.append(f"{name}{value}: {message}")  # words, less pydantic's "Value error, "
    return "environment variable " + "; ".join(problems)

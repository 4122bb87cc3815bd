"""One settings object for the whole process, read from ``AUTOSPEC_*`` environment variables.

| variable | default |
|---|---|
| ``AUTOSPEC_DATA_DIR`` | ``~/.autospec`` |
| ``AUTOSPEC_DATABASE_URL`` | ``sqlite:///<data dir>/autospec.db`` |
| ``AUTOSPEC_ARTIFACT_DIR`` | ``<data dir>/artifacts`` |
| ``AUTOSPEC_SPILL_DIR`` | ``<data dir>/spill`` (traffic rows waiting for the database) |
| ``AUTOSPEC_CACHE_DIR`` | ``$XDG_CACHE_HOME/autospec``, else ``~/.cache/autospec`` |
| ``AUTOSPEC_API_KEY`` | none (no authentication); the Bearer key ``autospec serve`` requires |

The cache holds only what can be derived again (a GGUF target dequantized to
safetensors); it is machine-wide, like Hugging Face's, so every data directory shares it.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


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
        default=None, description="API key the serving application requires (Bearer); "
        "clients of this package send it")

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
    """``AUTOSPEC_API_KEY`` in clear, or None when unset or empty (what clients send and
    what the applications ``demo`` and ``bench serve`` deploy require)."""
    key = get_settings().api_key
    return (key.get_secret_value() or None) if key is not None else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once; tests call ``get_settings.cache_clear()``)."""
    return Settings()

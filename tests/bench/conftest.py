"""Bench tests keep their cached traffic and features in their own temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_CACHE_DIR", str(tmp_path / "autospec-cache"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()

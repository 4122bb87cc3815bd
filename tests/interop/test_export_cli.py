"""``autospec export`` of a version whose artifact is gone, pruned or has a malformed
manifest: one line naming the version on stderr, exit 2, no traceback (tiny, CPU)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator


def _register(tiny, url: str, root: Path,  # type: ignore[no-untyped-def]
              meta: dict | None = None) -> Path:
    art = root / "ng-1"
    sha = save_speculator(new_speculator("ngram", tiny), art)
    engine = store.open_store(url, upgrade=True)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="ng-1", kind="ngram",
                                  target_id=tiny.info.target_id,
                                  target_revision=tiny.info.revision, artifact_uri=str(art),
                                  sha256=sha, meta=meta)
    engine.dispose()
    return art


@pytest.mark.parametrize(("damage", "words"), [
    ("deleted", "version 'ng-1': artifact .* is not a directory"),
    ("manifest", "version 'ng-1': .*manifest.json is not valid JSON"),
    ("pruned", "version 'ng-1' was pruned"),
])
def test_export_of_a_missing_or_pruned_artifact_is_one_line_exit_2_tiny(
        tiny, sqlite_url, tmp_path, damage, words):
    meta = {"pruned": {"at": "2026-01-01T00:00:00Z", "by": "cli"}} if damage == "pruned" \
        else None
    art = _register(tiny, sqlite_url, tmp_path / "artifacts", meta)
    if damage in ("deleted", "pruned"):
        shutil.rmtree(art)
    else:
        (art / "manifest.json").write_text("{not json")
    done = CliRunner().invoke(app, ["export", "ng-1", "--out", str(tmp_path / "out"),
                                    "--target", "/nonexistent", "--url", sqlite_url])
    assert done.exit_code == 2, done.output
    assert len(done.output.strip().splitlines()) == 1, done.output  # no traceback
    assert re.search(words, done.output), done.output


def test_export_of_builtin_ngram_for_a_given_target_needs_no_store_tiny(
        tiny, tmp_path, monkeypatch):
    """builtin-ngram for a given --target reads nothing stored: it exported on a fresh
    machine, until a missing store was refused (a mistyped path stays a mistake); it still
    does, and creates no store."""
    import autospec.engine.target as target_module
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    monkeypatch.setattr(target_module, "load_target", lambda spec, **_: tiny)
    try:
        done = CliRunner().invoke(app, ["export", "builtin-ngram", "--out",
                                        str(tmp_path / "out"), "--target", "tiny"])
        assert done.exit_code == 0, done.output
        assert (tmp_path / "out").is_dir() and not (tmp_path / "data").exists()
    finally:
        get_settings.cache_clear()

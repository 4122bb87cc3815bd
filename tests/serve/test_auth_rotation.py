"""Several API keys at once, and keys rotated through a key file without a restart
(issue 31, item 5). Tiny random-init target for the app tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from autospec.serve import auth
from autospec.serve.auth import KeyFileError, KeyRing
from autospec.serve.http import make_app
from autospec.settings import api_key, get_settings, parse_keys

from .helpers import make_server

BODY = {"prompt": "Hello", "max_tokens": 2}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("AUTOSPEC_API_KEY", raising=False)
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    monkeypatch.setattr(auth, "RECHECK_S", 0.0)  # re-read the file on every request
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _rewrite(path: Path, text: str) -> None:
    """Replace the file as a Kubernetes Secret update does (a new inode), with a new mtime."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    st = path.stat()
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    tmp.replace(path)


def test_key_lists_parse_commas_lines_and_comments():
    assert parse_keys("a, b,,a\n# old: c\n d \n\n") == ("a", "b", "d")
    assert parse_keys("") == ()


def test_several_keys_are_each_accepted_tiny(clean_env, tiny_llm, db):
    srv = make_server(tiny_llm, db, api_key="key-one,key-two")
    try:
        with TestClient(make_app(srv)) as c:
            assert c.post("/v1/completions", json=BODY, headers=_bearer("key-one")).is_success
            assert c.post("/v1/completions", json=BODY, headers=_bearer("key-two")).is_success
            assert c.get("/v1/models", headers=_bearer("key-one,key-two")).status_code == 401
            assert c.get("/v1/models").status_code == 401
    finally:
        srv.close()


def test_a_key_file_rotates_keys_without_a_restart_tiny(clean_env, tiny_llm, db, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# production keys\nold-key\n")
    srv = make_server(tiny_llm, db, api_key_file=keys)
    try:
        with TestClient(make_app(srv)) as c:
            assert c.get("/v1/models", headers=_bearer("old-key")).is_success
            assert c.get("/v1/models", headers=_bearer("new-key")).status_code == 401
            _rewrite(keys, "old-key\nnew-key\n")          # 1. add the new key
            assert c.get("/v1/models", headers=_bearer("new-key")).is_success
            assert c.get("/v1/models", headers=_bearer("old-key")).is_success
            _rewrite(keys, "new-key\n")                   # 2. clients moved: drop the old one
            assert c.get("/v1/models", headers=_bearer("old-key")).status_code == 401
            assert c.post("/v1/completions", json=BODY, headers=_bearer("new-key")).is_success
            keys.unlink()                                 # unreadable: the last keys hold
            assert c.get("/v1/models", headers=_bearer("new-key")).is_success
            keys.write_text("")                           # emptied on purpose: nobody
            assert c.get("/v1/models", headers=_bearer("new-key")).status_code == 401
            assert c.get("/health").status_code == 200
    finally:
        srv.close()


def test_the_key_file_from_the_environment_is_used_by_replicas_and_clients(clean_env,
                                                                          tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("first\nsecond\n")
    clean_env.setenv("AUTOSPEC_API_KEY_FILE", str(keys))
    get_settings.cache_clear()
    ring = auth.configured_keys(None)
    assert ring is not None and ring.keys() == ("first", "second")
    assert api_key() == "first"  # what loadgen, demo and bench send


def test_a_key_file_that_cannot_be_read_at_start_is_an_error(tmp_path):
    with pytest.raises(KeyFileError, match="cannot be read"):
        KeyRing(file=tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(KeyFileError, match="holds no key"):  # autospec serve's check
        KeyRing(file=tmp_path / "empty", require_key=True)


def test_a_replica_starting_on_an_emptied_key_file_refuses_every_request(tmp_path):
    """As api-keys-secret.yaml says: an emptied Secret refuses every request, on a replica
    that restarts meanwhile too (its constructor had failed, so Serve marked the app
    unhealthy)."""
    (tmp_path / "empty").write_text("# nothing yet\n")
    ring = KeyRing(file=tmp_path / "empty")
    assert ring.keys() == () and not ring.allows(b"Bearer anything")
    assert not ring.allows(b"Bearer ") and not ring.allows(b"")


def test_serve_refuses_a_missing_key_file_before_starting(clean_env, tmp_path):
    from autospec.cli import app

    result = CliRunner().invoke(app, ["serve", "--api-key-file", str(tmp_path / "nope")],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert "nope" in result.output and "cannot be read" in result.output

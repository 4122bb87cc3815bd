"""The dequantized target's cache directory under processes that start at once: each writes
its own directory and renames it into place (synced to disk first); one that loses the race
uses the winner's copy.
(The GGUF read and the model write are replaced by fakes: no model is loaded.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec.engine import target as t
from autospec.settings import get_settings
from tests.fsync_calls import needs_proc, recorded, rename_of, synced_after, unsynced_before


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSPEC_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    monkeypatch.setattr(t.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(t.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf")
    yield gguf
    get_settings.cache_clear()


def _write(directory: Path, who: str) -> None:
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_text(who)


def _final(tmp: Path) -> Path:
    """The directory a process's own ``.<name>.<random>`` directory is renamed to."""
    return tmp.parent / tmp.name[1:].rsplit(".", 1)[0]


def test_the_copy_is_written_once_and_nothing_else_is_left(fake_gguf, monkeypatch) -> None:
    monkeypatch.setattr(t, "write_model_dir", lambda m, tok, d: _write(d, "mine"))
    out = t._cached_from_gguf(fake_gguf, "fake")
    assert (out / "model.safetensors").read_text() == "mine"
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    monkeypatch.setattr(t, "write_model_dir", lambda *a: pytest.fail("written twice"))
    assert t._cached_from_gguf(fake_gguf, "fake") == out


def test_a_copy_another_process_finished_first_is_used(fake_gguf, monkeypatch) -> None:
    def racing(model, tokenizer, directory: Path) -> None:
        _write(directory, "mine")
        other = _final(directory)
        other.mkdir()
        _write(other, "theirs")  # the other process renamed its copy into place first

    monkeypatch.setattr(t, "write_model_dir", racing)
    out = t._cached_from_gguf(fake_gguf, "fake")
    assert (out / "model.safetensors").read_text() == "theirs"
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # our copy removed


def test_a_failed_write_is_raised_and_leaves_nothing(fake_gguf, monkeypatch) -> None:
    def failing(model, tokenizer, directory: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(t, "write_model_dir", failing)
    with pytest.raises(OSError, match="No space left"):
        t._cached_from_gguf(fake_gguf, "fake")
    assert list((get_settings().cache_dir / "targets").iterdir()) == []


@needs_proc
def test_the_copy_is_on_disk_before_it_takes_its_name(fake_gguf, monkeypatch) -> None:
    """A load trusts a copy whose files exist: after a power loss they must not be empty."""
    monkeypatch.setattr(t, "write_model_dir", lambda m, tok, d: _write(d, "mine"))
    with recorded(monkeypatch) as calls:
        out = t._cached_from_gguf(fake_gguf, "fake")
    moved = rename_of(calls, out)
    assert unsynced_before(calls, moved) == set()
    assert synced_after(calls, moved) == [str(out.parent)]

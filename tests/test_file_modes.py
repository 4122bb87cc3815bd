"""Weights files get the mode the umask gives every other file autospec writes.
safetensors' ``save_file`` writes a private temporary file (0600) and renames it into place:
``model.safetensors`` was ``-rw-------`` beside a ``-rw-r--r--`` config.json in the artifact
directory and in ``autospec export`` output (an operator trial), so another user — a vLLM
reading an export from shared storage — could not read it. Backups: tests/store/test_backup.py."""

from __future__ import annotations

import ast
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from autospec.file_modes import save_safetensors, umask
from tests.source import package_modules


@contextmanager
def umask_of(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Every file under ``root`` → its permission bits."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077], ids=oct)
def test_the_umask_is_read_as_set(mask: int) -> None:
    with umask_of(mask):
        assert umask() == mask
        assert umask() == mask  # reading it changed nothing


@pytest.mark.parametrize("mask", [0o022, 0o027], ids=oct)
def test_a_random_init_eagle3_artifact_and_its_export_are_as_the_umask_says_tiny(
        tiny, tmp_path: Path, mask: int) -> None:  # type: ignore[no-untyped-def]
    from autospec.interop.export import export_speculator
    from autospec.speculators.checkpoint import save_speculator
    from autospec.speculators.registry import new_speculator

    spec = new_speculator("eagle3", tiny, draft_vocab_size=40)
    with umask_of(mask):
        save_speculator(spec, tmp_path / "artifact")
        export_speculator(spec, tiny, tmp_path / "export", k=3)
    for root in ("artifact", "export"):
        found = modes(tmp_path / root)
        assert "model.safetensors" in found and "config.json" in found, found
        assert set(found.values()) == {0o666 & ~mask}, (root, found)


def test_save_safetensors_makes_no_file_more_open_than_the_umask(tmp_path: Path) -> None:
    with umask_of(0o077):
        save_safetensors({"a": torch.zeros(2)}, tmp_path / "x.safetensors")
    assert modes(tmp_path) == {"x.safetensors": 0o600}


def test_every_safetensors_file_is_written_through_save_safetensors() -> None:
    """A ``save_file`` call of its own would leave its file 0600 again."""
    calls = []
    for module, path in package_modules().items():
        if module == "autospec.file_modes":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute | ast.Name) and \
                    getattr(node, "attr", getattr(node, "id", None)) == "save_file":
                calls.append(f"{path}:{node.lineno}")
    assert calls == []

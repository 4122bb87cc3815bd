"""The artifact manifest: one format, one checker (hashlib and json only; no torch).

A speculator artifact is a directory of files plus ``manifest.json``::

    {"format": 1,
     "files": {"config.json": "<sha256 hex>", "model.safetensors": "<sha256 hex>"},
     "sha256": "<sha256 hex of canonical_json(files)>"}

``canonical_json`` is ``json.dumps(files, sort_keys=True, separators=(",", ":"))`` in UTF-8.
The top-level ``sha256`` is the artifact's identity (the store records it);
:func:`verify_manifest` recomputes it from the files on disk, so a tampered, truncated or
missing file is caught. Both the store (which must not import torch) and the speculator
checkpoint code use this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """A manifest or a file it lists is missing, malformed or does not match."""


def canonical_json(files: dict[str, str]) -> bytes:
    return json.dumps(files, sort_keys=True, separators=(",", ":")).encode("utf-8")


def files_digest(files: dict[str, str]) -> str:
    """The artifact sha256: of the canonical JSON of the per-file checksums."""
    return hashlib.sha256(canonical_json(files)).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(root: str | Path, names: Iterable[str] | None = None) -> str:
    """Write ``manifest.json`` for ``names`` (default: every file but the manifest)."""
    root = Path(root)
    if names is None:
        names = [f.name for f in sorted(root.iterdir()) if f.is_file() and f.name != MANIFEST]
    files = {name: file_sha256(root / name) for name in sorted(names)}
    digest = files_digest(files)
    manifest = {"format": MANIFEST_FORMAT, "files": files, "sha256": digest}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
    return digest


def read_manifest(root: Path) -> dict[str, str]:
    """The ``files`` map of ``root``'s manifest, checked for shape (not yet for content)."""
    path = root / MANIFEST
    if not root.is_dir():
        raise ManifestError(f"artifact {root} is not a directory")
    if (path.exists() or path.is_symlink()) and not path.is_file():  # a FIFO would block
        raise ManifestError(f"{path} is not a file (a directory, a device or a broken link)")
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"artifact {root} has no {MANIFEST}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # too deep
        raise ManifestError(f"{path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: expected manifest format {MANIFEST_FORMAT}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ManifestError(f"{path}: 'files' must map file names to SHA-256 hex")
    if manifest.get("sha256") != files_digest(files):
        raise ManifestError(f"{path}: artifact sha256 does not match its file checksums")
    return files


def verify_manifest(root: str | Path, *, required: Iterable[str] = ("config.json",),
                    exactly: Iterable[str] | None = None) -> str:
    """Check every checksum in ``root``'s manifest; return the artifact sha256.

    ``required``: files the manifest must list; ``exactly``: the only files it may list.
    """
    root = Path(root)
    files = read_manifest(root)
    if exactly is not None and sorted(files) != sorted(exactly):
        raise ManifestError(f"{root / MANIFEST}: must list exactly {sorted(exactly)}, "
                            f"lists {sorted(files)}")
    for name in required:
        if name not in files:
            raise ManifestError(f"artifact {root}: manifest does not list {name}")
    for name, expected in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ManifestError(f"artifact {root}: manifest names a file outside it: {name}")
        if not (root / name).is_file():
            raise ManifestError(f"artifact {root}: {name} is listed in the manifest but missing")
        try:
            actual = file_sha256(root / name)
        except OSError as exc:
            raise ManifestError(f"artifact {root}: cannot read {name}: "
                                f"{exc.strerror or exc}") from None
        if actual != expected:
            raise ManifestError(f"artifact {root}: {name}: sha256 mismatch (file "
                                f"{actual[:12]}…, manifest {expected[:12]}…)")
    return files_digest(files)

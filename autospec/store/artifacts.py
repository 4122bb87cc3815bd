"""Speculator artifact directories and their SHA-256 (no torch: hashlib and json only).

An artifact is a directory holding ``config.json``, ``model.safetensors`` (absent for
weightless kinds such as ``ngram``) and ``manifest.json``::

    {"format": 1,
     "files": {"config.json": "<sha256 hex>", "model.safetensors": "<sha256 hex>"},
     "sha256": "<sha256 hex of canonical_json(files)>"}

``canonical_json`` is ``json.dumps(files, sort_keys=True, separators=(",", ":"))`` encoded as
UTF-8. The artifact's SHA-256 is that last digest; :func:`artifact_sha256` recomputes it from
the files on disk, so a tampered or truncated file is caught. This mirrors
``autospec.speculators.checkpoint`` (which writes manifests) without importing it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from autospec.store.errors import ArtifactError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
REQUIRED_FILES = ("config.json",)
_CHUNK = 1 << 20


def canonical_json(files: dict[str, str]) -> bytes:
    return json.dumps(files, sort_keys=True, separators=(",", ":")).encode("utf-8")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def local_path(uri: str | Path) -> Path | None:
    """The local directory an artifact URI names (plain path or ``file://``); None if remote."""
    if isinstance(uri, Path):
        return uri
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:3] == ":\\"):
        return Path(uri)
    return None


def read_manifest(path: Path) -> dict[str, object]:
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise ArtifactError(f"artifact {path} is not a directory")
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"artifact {path} has no {MANIFEST}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{manifest_path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ArtifactError(f"{manifest_path}: expected format {MANIFEST_FORMAT}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ArtifactError(f"{manifest_path}: 'files' must map file names to SHA-256 hex")
    return manifest


def artifact_sha256(path: str | Path) -> str:
    """Recompute and check an artifact's SHA-256 from its files; raise :class:`ArtifactError`."""
    root = local_path(path)
    if root is None:
        raise ArtifactError(f"cannot read artifact {path}: not a local path or file:// URI")
    manifest = read_manifest(root)
    files: dict[str, str] = manifest["files"]  # type: ignore[assignment]
    for name in REQUIRED_FILES:
        if name not in files:
            raise ArtifactError(f"artifact {root}: manifest does not list {name}")
    for name, expected in files.items():
        file = root / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ArtifactError(f"artifact {root}: manifest names a file outside it: {name}")
        if not file.is_file():
            raise ArtifactError(f"artifact {root}: {name} is listed in the manifest but missing")
        actual = file_sha256(file)
        if actual != expected:
            raise ArtifactError(
                f"artifact {root}: {name} has SHA-256 {actual}, manifest says {expected}"
            )
    digest = hashlib.sha256(canonical_json(files)).hexdigest()
    if manifest.get("sha256") != digest:
        raise ArtifactError(
            f"artifact {root}: manifest sha256 {manifest.get('sha256')!r} != {digest} "
            f"computed from its files"
        )
    return digest


def write_manifest(path: str | Path) -> str:
    """Write ``manifest.json`` for the files in ``path`` (except itself); return the SHA-256.

    For tests and weightless kinds; trained speculators get theirs from their checkpoint code.
    """
    root = Path(path)
    files = {
        f.name: file_sha256(f) for f in sorted(root.iterdir()) if f.is_file() and f.name != MANIFEST
    }
    digest = hashlib.sha256(canonical_json(files)).hexdigest()
    manifest = {"format": MANIFEST_FORMAT, "files": files, "sha256": digest}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
    return digest

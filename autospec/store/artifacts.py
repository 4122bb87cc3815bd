"""Speculator artifacts as the store sees them: a local path or ``file://`` URI whose
manifest (format and checks in :mod:`autospec.artifacts`) gives the artifact's SHA-256.
No torch here.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from autospec.artifacts import ManifestError, verify_manifest
from autospec.artifacts import write_manifest as write_manifest
from autospec.store.errors import ArtifactError


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


def artifact_sha256(path: str | Path) -> str:
    """Recompute and check an artifact's SHA-256 from its files; raise :class:`ArtifactError`."""
    root = local_path(path)
    if root is None:
        raise ArtifactError(f"cannot read artifact {path}: not a local path or file:// URI")
    try:
        return verify_manifest(root)
    except ManifestError as exc:
        raise ArtifactError(str(exc)) from None

"""Speculator artifacts as the store sees them: a local path or ``file://`` URI whose
manifest (format and checks in :mod:`autospec.artifacts`) gives the artifact's SHA-256.
:func:`inside` is the one check that a path built from a version name, or read from a
backup's index, stays in its directory (no ``..``, no absolute path, no symlink out).
No torch here.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from autospec.artifacts import ManifestError, verify_manifest
from autospec.artifacts import write_manifest as write_manifest
from autospec.store.errors import ArtifactError


def inside(root: Path, name: str, *, what: str = "version") -> Path:
    """``root / name`` when ``name`` is a relative path whose every part is a plain name and
    which, symlinks followed, stays below ``root``; :class:`ArtifactError` naming it if not
    (``../x``, ``/etc``, ``a/../../b``, or a symlink pointing out of ``root``)."""
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or any(p in ("..", ".", "") for p in parts) \
            or "\\" in name:
        raise ArtifactError(f"{what} {name!r} is not a plain relative name below {root}: "
                            f"refused (it could reach outside the directory)")
    path = root / name
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        raise ArtifactError(f"{what} {name!r}: {path} resolves to {path.resolve()}, outside "
                            f"{root} (a symlink pointing out): refused") from None
    return path


def without_links(directory: Path, *, what: str) -> Path:
    """``directory`` when nothing in it is a symlink (copying one would copy what it points
    at, wherever that is); :class:`ArtifactError` naming the first link otherwise."""
    link = next((p for p in [directory, *directory.rglob("*")] if p.is_symlink()), None)
    if link is not None:
        raise ArtifactError(f"{what}: {link} is a symbolic link: refused")
    return directory


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

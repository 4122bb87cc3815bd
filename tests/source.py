"""The autospec package's modules as files, read without importing anything (shared by the
import-graph and doc-reference checks)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_modules() -> dict[str, Path]:
    """Module name → file, for every module of the autospec package under autospec/."""
    found = {}
    for path in ROOT.glob("autospec/**/*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found

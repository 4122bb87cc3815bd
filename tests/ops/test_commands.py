"""Every `autospec ...` command the deployment files run exists, with the options they give
it: the images (ops/Dockerfile), their entry point, the KubeRay manifests, the cluster
launcher config and the systemd unit. Resolved against the CLI (`autospec.cli:app`);
nothing runs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from autospec.cli import app
from tests.ops.helpers import (
    KUBERAY,
    OPS,
    commands_in_comments,
    commands_in_shell,
    commands_in_words,
    dockerfile,
    exec_form,
    manifest_commands,
    resolve,
)


def dockerfile_commands() -> Iterator[list[str]]:
    for ins in dockerfile():
        if ins.name in ("RUN", "CMD", "ENTRYPOINT"):
            words = exec_form(ins.args)
            yield from commands_in_words(words) if words else commands_in_shell(ins.args)
    yield from commands_in_comments((OPS / "Dockerfile").read_text())


def script_commands(path: Path) -> Iterator[list[str]]:
    for line in path.read_text().splitlines():
        if not line.lstrip().startswith("#"):
            yield from commands_in_shell(line)
    yield from commands_in_comments(path.read_text())


def cluster_commands() -> Iterator[list[str]]:
    path = OPS / "cluster.yaml"
    config = yaml.safe_load(path.read_text())
    for key, commands in config.items():
        if key.endswith("_commands"):
            for command in commands:
                yield from commands_in_shell(command)
    yield from commands_in_comments(path.read_text())


def unit_commands(path: Path) -> Iterator[list[str]]:
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.startswith("Exec"):
            # systemd: $$ is a literal $; a leading -, @, +, ! changes how it runs, not what
            yield from commands_in_shell(value.lstrip("-@+!").replace("$$", "$"))
    yield from commands_in_comments(path.read_text())


SOURCES = {
    "ops/Dockerfile": dockerfile_commands,
    "ops/entrypoint.sh": lambda: script_commands(OPS / "entrypoint.sh"),
    "ops/install.sh": lambda: script_commands(OPS / "install.sh"),
    "ops/cluster.yaml": cluster_commands,
    **{f"ops/kuberay/{p.name}": (lambda p=p: manifest_commands(p)) for p in KUBERAY},
    **{f"ops/systemd/{p.name}": (lambda p=p: unit_commands(p))
       for p in sorted((OPS / "systemd").glob("*.service"))},
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_autospec_command_exists_with_its_options(source: str) -> None:
    problems = [f"{' '.join(words)}: {problem}" for words in SOURCES[source]()
                if (problem := resolve(app, words))]
    assert not problems, "\n".join(problems)


def test_the_commands_that_matter_are_found() -> None:
    """The extraction sees what each place runs (an empty search would pass the test above)."""
    def found(source: str) -> set[str]:
        return {" ".join(w for w in words if not w.startswith("$"))
                for words in SOURCES[source]()}

    assert {"autospec serve --host 0.0.0.0", "autospec controller run --policy",
            "autospec db upgrade", "autospec db current"} <= found("ops/entrypoint.sh")
    assert {"autospec db upgrade"} <= found("ops/kuberay/db-upgrade-job.yaml")
    assert {"autospec db current"} <= found("ops/kuberay/rayservice.yaml")
    assert {"autospec controller run --policy /etc/autospec/policy.yaml",
            "autospec db current"} <= found("ops/kuberay/controller.yaml")
    assert {"autospec controller run --policy /shared/autospec/policy.yaml"} <= found(
        "ops/systemd/autospec-controller.service")
    assert {"autospec db upgrade", "autospec serve --address auto --detach --host 0.0.0.0 "
            "--replicas 2 --num-gpus 1"} <= found("ops/cluster.yaml")  # clients reach it


def test_resolve_catches_a_wrong_command_or_option() -> None:
    assert resolve(app, ["autospec", "db", "current"]) is None
    assert resolve(app, ["autospec", "db", "curent"]) is not None
    assert resolve(app, ["autospec", "controller", "run", "--polcy", "x"]) is not None
    assert resolve(app, ["autospec", "controller"]) is not None
    assert resolve(app, ["autospec", "serve", "--host=0.0.0.0", "--num-gpus", "1"]) is None
    # docker exec NAME COMMAND: the container named autospec is not the command
    (words,) = commands_in_shell("docker exec autospec autospec db current")
    assert words == ["autospec", "db", "current"]


def test_shell_commands_parse() -> None:
    """bash -n on the scripts and on every command string of the cluster launcher."""
    for script in ("entrypoint.sh", "install.sh"):
        subprocess.run(["bash", "-n", str(OPS / script)], check=True, timeout=30)
    config = yaml.safe_load((OPS / "cluster.yaml").read_text())
    for key, commands in config.items():
        if key.endswith("_commands"):
            for command in commands:
                assert isinstance(command, str), f"{key}: {command!r} is not one string"
                subprocess.run(["bash", "-n", "-c", command], check=True, timeout=30)


def policy_of(words: list[str]) -> str | None:
    return words[words.index("--policy") + 1] if "--policy" in words else None


@pytest.mark.parametrize("source", ["ops/kuberay/controller.yaml",
                                    "ops/systemd/autospec-controller.service"])
def test_one_off_cycles_use_the_running_controllers_policy(source: str) -> None:
    """A `controller once` or `watch` a file tells the operator to run beside its controller
    names that controller's --policy: without it the shipped default runs (another gate,
    in-process training) and is recorded as the policy in force for `autospec status`."""
    controllers = [w for w in SOURCES[source]() if w[:2] == ["autospec", "controller"]]
    (running,) = {policy_of(w) for w in controllers if w[2] == "run"}
    assert running is not None and running != "default"
    for words in controllers:
        assert policy_of(words) == running, " ".join(words)


def test_serve_deploy_is_given_the_dashboards_address() -> None:
    """`serve deploy` talks to the dashboard's HTTP address (--address, else
    RAY_DASHBOARD_ADDRESS), not RAY_ADDRESS (a GCS or ray:// address) as `serve run` and
    `ray.init` do: what the deployment files say about `serve deploy` names the variable
    Ray's own CLI reads."""
    from ray.serve.scripts import deploy

    (address,) = [p for p in deploy.params if p.name == "address"]
    assert "RAY_DASHBOARD_ADDRESS" in (address.help or "")
    for name in ("serve_config.yaml", "README-serve.md"):
        lines = (OPS / name).read_text().splitlines()
        (i,) = [i for i, ln in enumerate(lines) if "serve deploy ops/serve_config.yaml" in ln]
        said = " ".join(lines[i:i + 3])
        assert "RAY_DASHBOARD_ADDRESS" in said and "RAY_ADDRESS or" not in said, name

"""Readers of the deployment files under ops/: the Dockerfile's instructions, the build
context it sees (.dockerignore), the YAML manifests, and the ``autospec ...`` commands they
all run, resolved against the CLI (``autospec.cli:app``)."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
DOCKERFILE = OPS / "Dockerfile"
KUBERAY = sorted((OPS / "kuberay").glob("*.yaml"))


# -- Dockerfile -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    name: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the logical line, continuations joined


def dockerfile(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions, continuation lines joined and comment lines dropped (as docker does,
    inside continuations too)."""
    out: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = pending + line
        pending = ""
        name, _, args = logical.partition(" ")
        out.append(Instruction(name.upper(), args.strip()))
    assert not pending, f"{path}: the last instruction ends with a continuation"
    return out


def exec_form(args: str) -> list[str] | None:
    """An instruction's JSON (exec) form as a list, or None for the shell form."""
    return json.loads(args) if args.startswith("[") else None


@dataclass(frozen=True)
class Copy:
    sources: list[str]
    dest: str
    workdir: str


def copies(instructions: list[Instruction]) -> list[Copy]:
    """COPY instructions from the build context (not --from another stage), with the WORKDIR
    in force at each."""
    workdir, out = "/", []
    for ins in instructions:
        if ins.name == "WORKDIR":
            workdir = str(Path(workdir) / ins.args)
        elif ins.name in ("COPY", "ADD"):
            words = exec_form(ins.args) or shlex.split(ins.args)
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            assert not any(f.startswith("--from") for f in flags), "one stage only"
            out.append(Copy(paths[:-1], paths[-1], workdir))
    return out


def dockerignore_patterns(root: Path = ROOT) -> list[str]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    return [p.lstrip("/") for p in patterns]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's matching (Go filepath.Match plus `**`) as a regular expression."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether a context path (or a directory above it) matches a .dockerignore pattern."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(_pattern_regex(p).match(prefix) for p in patterns for prefix in prefixes)


def context_files(root: Path = ROOT) -> Iterator[str]:
    """Every file of the build context: the directory less what .dockerignore excludes
    (an excluded directory is not walked)."""
    patterns = dockerignore_patterns(root)
    for here, dirs, files in os.walk(root):
        base = Path(here).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = sorted(d for d in dirs if not ignored(prefix + d, patterns))
        for name in sorted(files):
            if not ignored(prefix + name, patterns):
                yield prefix + name


# -- YAML manifests ---------------------------------------------------------------------------

def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every pod a document makes (Deployments, Jobs, RayService groups)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    name = doc["metadata"]["name"]
    if kind in ("Deployment", "Job"):
        yield name, spec["template"]["spec"]
    elif kind == "RayService":
        cluster = spec["rayClusterConfig"]
        yield f"{name}/head", cluster["headGroupSpec"]["template"]["spec"]
        for group in cluster.get("workerGroupSpecs", []):
            yield f"{name}/{group['groupName']}", group["template"]["spec"]


def containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod.get("initContainers", [])
    yield from pod.get("containers", [])


# -- autospec commands ------------------------------------------------------------------------

_SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "$(", "`", ";;"}
_COMMAND_WORDS = ("autospec ", "ray ", "kubectl ", "docker ", "sudo ", "serve ")


def shell_words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()`")
    lexer.commenters = ""
    lexer.whitespace_split = True
    return list(lexer)


_DOCKER_EXEC_VALUED = {"-e", "--env", "--env-file", "-u", "--user", "-w", "--workdir"}


def _docker_exec_containers(words: list[str]) -> set[int]:
    """Positions of the container names in `docker exec [OPTIONS] NAME COMMAND...`."""
    names = set()
    for i, word in enumerate(words[1:], 1):
        if word == "exec" and words[i - 1].endswith("docker"):
            j = i + 1
            while j < len(words) and words[j].startswith("-"):
                j += 2 if words[j] in _DOCKER_EXEC_VALUED else 1
            names.add(j)
    return names


def commands_in_words(words: list[str]) -> Iterator[list[str]]:
    """Every ``autospec ...`` command in a list of words (up to a shell operator); a word with
    spaces in it (`bash -c '...'`, `ray exec CONFIG '...'`) is searched as a shell line too.
    The container named autospec in `docker exec autospec ...` is not the command."""
    containers = _docker_exec_containers(words)
    for i, word in enumerate(words):
        if " " in word.strip():
            yield from commands_in_shell(word)
        if word == "autospec" and i not in containers:
            tail = []
            for w in words[i + 1:]:
                if w in _OPERATORS:
                    break
                tail.append(w)
            yield ["autospec", *tail]


def commands_in_shell(text: str) -> Iterator[list[str]]:
    try:
        words = shell_words(text)
    except ValueError:  # unbalanced quotes: prose, not a command
        return
    yield from commands_in_words(words)


def commands_in_comments(text: str) -> Iterator[list[str]]:
    """Commands a file's comments give: `backticked` spans, and comment lines that start
    with a command (`#   ray exec ops/cluster.yaml 'autospec db upgrade'`)."""
    for span in re.findall(r"`([^`\n]+)`", text):
        if " " in span:  # one word (`autospec`) is a name, not a command
            yield from commands_in_shell(span)
    for line in text.splitlines():
        comment = line.partition("#")[2].strip() if "#" in line else ""
        if comment.startswith(_COMMAND_WORDS):
            yield from commands_in_shell(comment)


def manifest_commands(path: Path) -> Iterator[list[str]]:
    """What the containers of a manifest run (command + args), and its comments' commands."""
    for doc in documents(path):
        if "kind" not in doc:
            continue
        for _, pod in pod_specs(doc):
            for container in containers(pod):
                words = [*container.get("command", []), *container.get("args", [])]
                yield from commands_in_words(words)
    yield from commands_in_comments(path.read_text())


def resolve(app: typer.Typer, words: list[str]) -> str | None:
    """None when ``autospec WORDS`` names a command and every option given is one of its
    options; else what is wrong."""
    # typer may carry its own copy of click: a group is what has sub-commands
    command: Any = typer.main.get_command(app)
    path = ["autospec"]
    rest = list(words[1:])
    while isinstance(getattr(command, "commands", None), dict):
        if not rest:
            return f"{' '.join(path)}: a group, no command given"
        word = rest.pop(0)
        if word.startswith("$"):
            return None  # a variable: what it names is checked where it is set
        sub = command.commands.get(word)
        if sub is None:
            return f"{' '.join(path)} has no command {word!r}"
        command, path = sub, [*path, word]
    known = {"--help"} | {opt for p in command.params
                          for opt in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    for word in rest:
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            if name not in known:
                return f"{' '.join(path)} has no option {name!r}"
    return None


"""Every ``autospec`` and ``make`` command the docs tell an operator to run exists, with the
options they give it (issue 31, item 6): the fenced code blocks and the inline code of
README.md, docs/*.md and ops/**/*.md are read, each ``autospec ...`` command is resolved
through the CLI's own command tree (Typer → click, nothing run) and each ``--option`` is
checked against that command's parameters; each ``make TARGET`` against the Makefile."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from autospec.cli import app

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SEPARATORS = re.compile(r"&&|\|\||;|\||\$\(|\)")
RUNNERS = ("autospec", ".venv/bin/autospec", "$VENV/bin/autospec")


def doc_files() -> list[Path]:
    return sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("ops/**/*.md")])


def _logical_lines(block: str) -> list[str]:
    """Lines of a shell block, continuations joined, prompts and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", block)
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(\$|#\s*\$|>>>)\s+", "", line)
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines


def _segments(line: str) -> list[list[str]]:
    """The simple commands of one line, as shell words (None-safe on odd quoting)."""
    out = []
    for part in SEPARATORS.split(line):
        try:
            words = shlex.split(part, posix=True)
        except ValueError:
            words = part.split()
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value cmd
            words = words[1:]
        if words:
            out.append(words)
    return out


def commands_in(text: str) -> list[tuple[str, list[str]]]:
    """(kind, words) for each ``autospec``/``make`` command in fenced blocks and in inline
    code that starts with one."""
    found: list[tuple[str, list[str]]] = []
    spans = [m.group(1) for m in FENCE.finditer(text)]
    rest = FENCE.sub("", text)
    spans += [m.group(1) for m in INLINE.finditer(rest)
              if m.group(1).startswith(("autospec ", "make "))]
    for span in spans:
        for line in _logical_lines(span):
            for words in _segments(line):
                if words[0] in RUNNERS:
                    found.append(("autospec", words[1:]))
                elif words[0] == "make" and len(words) > 1:
                    found.append(("make", words[1:]))
    return found


def _options(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
    return names


def check_autospec(words: list[str], root: Any) -> str | None:
    """None when ``autospec <words>`` names a command and only options it has; else why not."""
    command, path = root, ["autospec"]
    rest = list(words)
    while _is_group(command) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        if "|" in name or name.startswith(("<", "[")) or name in ("...", "…"):
            return None  # `controller run|once|watch`, `<command>`: a family named in prose
        sub = command.commands.get(name)
        if sub is None:
            return f"{' '.join(path)} has no command {name!r}"
        command, path = sub, [*path, name]
    if _is_group(command) and not rest:
        return None  # `autospec db`, `autospec bench`: a group named in prose
    known = _options(command)
    for word in rest:
        if word.startswith("--") and len(word) > 2:
            option = word.split("=", 1)[0]
            if option not in known and not option.startswith("--<"):
                return f"{' '.join(path)} has no option {option}"
    return missing_companion(path, rest)


#: (command path, option) -> the option the CLI refuses it without (exit 2): a doc that
#: shows one without the other tells the reader to run a command that fails
COMPANIONS = {
    (("promote",), "--force"): "--reason",
    (("rollback",), "--unpin"): "--segment",
    (("loadgen",), "--per-request"): "--json",
}


def missing_companion(path: list[str], words: list[str]) -> str | None:
    """Why ``words`` (the options given to the command at ``path``) would be refused for
    lack of a companion option; None if not."""
    given = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    for (command, option), needed in COMPANIONS.items():
        if tuple(path[1:]) == command and option in given and needed not in given:
            return f"{' '.join(path)} {option} needs {needed}"
    return None


def _is_group(command: Any) -> bool:
    """Typer's command classes come from its own copy of click: duck-typed."""
    return isinstance(getattr(command, "commands", None), dict)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M)}


def check_make(words: list[str], targets: set[str]) -> str | None:
    for word in words:
        if "=" in word or word.startswith("-"):
            continue
        return None if word in targets else f"the Makefile has no target {word!r}"
    return None


def problems() -> list[str]:
    root = typer.main.get_command(app)
    targets = make_targets()
    bad = []
    for path in doc_files():
        for kind, words in commands_in(path.read_text(encoding="utf-8")):
            why = check_autospec(words, root) if kind == "autospec" else check_make(words,
                                                                                   targets)
            if why:
                bad.append(f"{path.relative_to(ROOT)}: `{kind} {' '.join(words)}`: {why}")
    return sorted(set(bad))


def test_every_command_in_the_docs_exists_with_its_options() -> None:
    assert problems() == []


def test_the_docs_name_commands_at_all() -> None:
    """The reader finds the commands (guards against a parser that finds nothing)."""
    readme = commands_in((ROOT / "README.md").read_text())
    assert ("make", ["demo"]) in readme and ("make", ["test"]) in readme
    runbook = [w for k, w in commands_in((ROOT / "ops/RUNBOOK.md").read_text())
               if k == "autospec"]
    assert len(runbook) >= 10 and any(w[:2] == ["db", "upgrade"] for w in runbook)


@pytest.mark.parametrize(("doc", "why"), [
    ("```bash\nautospec serve --no-such-flag 1\n```", "has no option --no-such-flag"),
    ("```bash\nautospec db vacuum\n```", "has no command 'vacuum'"),
    ("run `autospec promote v1 --reason x --forcee`", "has no option --forcee"),
    ("```\n$ AUTOSPEC_X=1 autospec \\\n   controler once\n```", "has no command 'controler'"),
    ("```bash\nmake install && make frobnicate\n```", "no target 'frobnicate'"),
    ("then `autospec promote v1 --force` made it live", "--force needs --reason"),
])
def test_the_check_catches_a_stale_command(doc: str, why: str) -> None:
    root = typer.main.get_command(app)
    found = commands_in(doc)
    reasons = [check_autospec(w, root) if k == "autospec" else check_make(w, make_targets())
               for k, w in found]
    assert any(r and why in r for r in reasons), reasons


def test_good_commands_pass() -> None:
    root = typer.main.get_command(app)
    for words in (["serve", "--engine", "vllm", "--vllm-option", "max_model_len=4096"],
                  ["controller", "once", "--json"], ["db", "upgrade"], ["status", "--help"],
                  ["controller", "run|once|watch"],
                  ["promote", "v1", "--force", "--reason", "x"]):
        assert check_autospec(words, root) is None, words

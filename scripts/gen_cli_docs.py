"""Write docs/cli.md: the reference of every ``autospec`` command, generated from the Typer
app (the same help text ``--help`` shows). ``--check`` exits 1 when the file is stale.

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check    # CI: is the committed file up to date?
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "cli.md"
HEADER = """# CLI reference

Generated from the commands' `--help` by `make docs` (`scripts/gen_cli_docs.py`); do not
edit by hand. Every command also prints this with `--help` (or `-h`).

Every command that opens the store takes it as `--database-url` or `--url` (the same
option); `autospec loadgen --url` is another thing, the server it sends requests to, and
the `bench` commands' `--database-url` (`--url` too) says what each does with it.

Exit status, for scripts: 0 done; 2 a usage error (a bad option or value, a file that
cannot be read: one line naming the option) or an error (the store unreachable or failing,
an unknown version, a cycle that failed); 3 refused (the gate rejected, `promote` without a
passing evaluation, nothing to roll back); 1 the run went through but its result is a
failure — `loadgen` with failed requests (or no server answering), `serve` whose replicas
did not start, `demo` ended early, `bench swap` with failed requests, `bench soak` and
`soak-report` with a goal missed, `db current` on a store this code cannot run against;
130 a run stopped by Ctrl-C (`demo`, `bench soak`, `controller once`, `watch`, `run`), 143
by SIGTERM (`bench soak` and the `controller` commands); `serve` stops on either with 0.
With `--json`, a refusal is a JSON object on stdout too (`controller once`: its `outcome`
`rejected`; `evaluate`: its decision; `promote` and `rollback`: `{"outcome": "refused",
"reason": ..., "exit_code": 3, ...}`), beside its line on stderr.
"""


def _default(param: Any) -> str:
    if getattr(param, "is_flag", False) and not param.secondary_opts:
        return ""
    value = param.default
    if value is None or callable(value) or value == () or param.required:
        return ""
    if isinstance(value, bool) and param.secondary_opts:
        return f"`{param.opts[0] if value else param.secondary_opts[0]}`"
    return f"`{value}`"


def _names(param: Any) -> str:
    names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    return names


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _command(path: str, cmd: Any, ctx: Any) -> list[str]:
    lines = [f"## `{path}`", "", inspect.cleandoc(cmd.help or "").strip(), ""]
    lines += ["```", " ".join(cmd.collect_usage_pieces(ctx)).join([f"{path} ", ""]), "```", ""]
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    if args:
        lines += ["| argument | help |", "|---|---|"]
        lines += [f"| `{p.name.upper()}` | {_cell(getattr(p, 'help', ''))} |"
                  for p in args]
        lines.append("")
    if opts:
        lines += ["| option | default | help |", "|---|---|---|"]
        lines += [f"| {_names(p)} | {_default(p)} | {_cell(p.help)} |" for p in opts
                  if p.name != "help"]
        lines.append("")
    return lines


def _walk(path: str, cmd: Any, parent: Any) -> list[str]:
    import click

    ctx = click.Context(cmd, info_name=path.split()[-1], parent=parent)
    if hasattr(cmd, "commands"):
        own = [p for p in cmd.params if p.name != "help"]
        if parent is None:
            lines = []
        elif own:  # a group that also runs on its own (`autospec versions`): its options too
            lines = _command(path, cmd, ctx)
        else:
            lines = [f"## `{path}`", "", inspect.cleandoc(cmd.help or "").strip(), ""]
        for name in sorted(cmd.commands):
            lines += _walk(f"{path} {name}", cmd.commands[name], ctx)
        return lines
    return _command(path, cmd, ctx)


def render() -> str:
    import typer.main

    from autospec.cli import app

    root = typer.main.get_command(app)
    body = _walk("autospec", root, None)
    return HEADER + "\n" + "\n".join(body).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            sys.stderr.write("docs/cli.md is out of date: run `python scripts/gen_cli_docs.py`\n")
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

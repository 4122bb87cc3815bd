"""The ``autospec`` command line (Typer).

Each area owns its sub-commands in its own module; this file only wires them.
Heavy imports (torch, ray) happen inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import typer

from autospec.bench.cli import bench_app
from autospec.cli_errors import Commands
from autospec.cli_summaries import one_line_summaries
from autospec.controller import cli as controller_cli
from autospec.controller.evaluate_cli import evaluate
from autospec.controller.ledger_cli import ledger
from autospec.controller.run_cli import controller_app
from autospec.demo.cli import demo
from autospec.interop import cli as interop_cli
from autospec.loadgen.cli import loadgen
from autospec.serve.cli import serve
from autospec.store.cli import db_app
from autospec.synth.cli import pretrain, synth
from autospec.train.cli import train

app = typer.Typer(
    name="autospec",
    help="Keep an LLM's speculative-decoding speculator fitted to the traffic it serves.",
    no_args_is_help=True,
    cls=Commands,  # a database error out of any command: one line, exit 2
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's -h too
)


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        print(f"autospec {version('autospec')}")
        raise typer.Exit()


@app.callback()
def _main(_: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print autospec's version and exit")) -> None:
    """Keep an LLM's speculative-decoding speculator fitted to the traffic it serves."""


app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
app.command("serve")(serve)
app.command("evaluate")(evaluate)
app.add_typer(controller_app, name="controller")
for _name in ("status", "promote", "rollback", "history"):
    app.command(_name)(getattr(controller_cli, _name))
app.add_typer(controller_cli.versions_app, name="versions")  # lists; `versions prune`
app.command("ledger")(ledger)
app.command("train")(train)
app.command("synth")(synth)
app.command("pretrain")(pretrain)
app.command("loadgen")(loadgen)
app.command("demo")(demo)
app.command("export")(interop_cli.export)
app.command("import")(interop_cli.import_)
one_line_summaries(app)


if __name__ == "__main__":
    app()

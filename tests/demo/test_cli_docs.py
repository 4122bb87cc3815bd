"""docs/cli.md is generated from the Typer app; the committed file must match the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_cli_docs.py"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_cli_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_cli_reference_is_up_to_date() -> None:
    gen = _generator()
    assert gen.OUT.read_text(encoding="utf-8") == gen.render(), \
        "docs/cli.md is stale: run `python scripts/gen_cli_docs.py`"


def test_cli_reference_covers_every_command() -> None:
    text = _generator().render()
    for command in ("serve", "loadgen", "demo", "status", "promote", "rollback", "versions",
                    "history", "train", "evaluate", "controller run", "controller once",
                    "db upgrade", "bench decode"):
        assert f"## `autospec {command}`" in text, command

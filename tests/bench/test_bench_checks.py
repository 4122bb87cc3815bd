"""Every ``autospec bench`` command refuses a target, dtype, checkpoint or output path it
cannot use before it loads a model, starts Ray or logs traffic: exit 2 naming the option,
never a traceback (found by walking the CLI: ``bench decode --target /no/such`` and
``--eagle3 /no/such``, ``bench serve --engine native --dtype float16``, ``bench soak --out
FILE`` were tracebacks; ``bench train --kinds eagle`` and ``bench segments --output DIR``
were refused, or failed, only after minutes of logging traffic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "a-dir").mkdir()
    return {"FILE": str(a_file), "DIR": str(tmp_path / "a-dir"),
            "MISSING": str(tmp_path / "no" / "such")}


@pytest.mark.parametrize(("args", "words"), [
    (["bench", "decode", "--target", "MISSING"], "Invalid value for --target: target '"),
    (["bench", "decode", "--eagle3", "MISSING"], "Invalid value for --eagle3: "),
    (["bench", "decode", "--draft", "DIR", "--kinds", "draft"],
     "Invalid value for --draft: artifact"),
    (["bench", "serve", "--engine", "native", "--dtype", "float16"],
     "Invalid value for --dtype: unknown dtype 'float16'"),
    (["bench", "serve", "--target", "MISSING"], "Invalid value for --target: target '"),
    (["bench", "swap", "--target", "MISSING"], "--target"),  # or: vLLM not installed
    (["bench", "soak", "--duration", "1", "--out", "FILE"],
     "Invalid value for --out: FILE is a file; it names a directory"),
    (["bench", "soak", "--duration", "1", "--target", "MISSING"], "Invalid value for --target"),
    (["bench", "segments", "--output", "DIR"], "Invalid value for --output: DIR is a directory"),
    (["bench", "segments", "--workdir", "FILE"], "Invalid value for --workdir: FILE is a file"),
    (["bench", "segments", "--target", "MISSING"], "Invalid value for --target"),
    (["bench", "train", "--kinds", "eagle,suffix"], "--kinds: kinds ['eagle', 'suffix']: give"),
    (["bench", "train", "--variants", "bse"], "--variants: unknown variants ['bse']"),
    (["bench", "train", "--domain", "legal"], "--domain: unknown domain 'legal'"),
    (["bench", "train", "--base", "MISSING"], "Invalid value for --base: MISSING does not"),
    (["bench", "train", "--workdir", "FILE"], "Invalid value for --workdir: FILE is a file"),
    (["bench", "train", "--dtype", "float16"], "Invalid value for --dtype: unknown dtype"),
    (["bench", "serve", "--engine", "native", "--url", "not a url"],
     "Invalid value for --database-url: malformed database URL"),  # Ray started first
    (["bench", "serve", "--engine", "native", "--url", "sqlite:///MISSING"],
     "Invalid value for --database-url: database file MISSING does not exist"),
    (["bench", "store", "--url", "not a url"], "Invalid value for --database-url: malformed"),
    (["bench", "store", "--url", "mysql://x@y/z"], "--database-url: cannot use database URL"),
])
def test_a_bench_refuses_what_it_cannot_use_before_it_starts(
        args: list[str], words: str, paths: dict[str, str], monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    args = [paths.get(a, a) for a in args]
    result = CliRunner().invoke(app, args)
    if args[1] == "swap" and "needs vLLM" in result.output:
        pytest.skip("bench swap refuses first without vLLM")
    text = " ".join(result.output.replace("│", " ").split())
    for name, path in paths.items():
        text = text.replace(path, name)
    assert result.exit_code == 2, result.output
    assert words in text and "Traceback" not in result.output

"""`autospec bench decode` says what it is doing: a line per finished run and partial JSON
as it goes (tiny random-init target with SmolLM2's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.bench import decode
from autospec.cli import app
from tests.serve.helpers import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


ARGS = ["bench", "decode", "--dtype", "float32", "--max-new-tokens", "4", "--prompts", "1",
        "--kinds", "ngram"]


def test_bench_decode_prints_each_run_and_writes_json_tiny(tiny_dir: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    result = CliRunner().invoke(app, [*ARGS, "--target", str(tiny_dir), "--json", str(out)])
    assert result.exit_code == 0, result.output
    names = ["engine-target-only", "hf-generate", "hf-generate-prompt-lookup(k=5)",
             "engine+ngram(k=5)", "engine+oracle(k=5)"]
    for name in names:
        assert f"float32 {name}: " in result.output  # one progress line per run
    report = json.loads(out.read_text())
    assert report["complete"] is True and "stage" not in report
    assert [r["name"] for r in report["by_dtype"]["float32"]["runs"]] == names
    assert report["runs"] == report["by_dtype"]["float32"]["runs"]
    assert report["by_dtype"]["float32"]["verify_cost_ratio"]


def test_a_stopped_bench_decode_leaves_partial_json_tiny(
        tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = decode.engine_run

    def stops_at_ngram(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "ngram" in name:
            raise KeyboardInterrupt  # as a timeout or Ctrl-C would
        return real(name, *args, **kwargs)

    monkeypatch.setattr(decode, "engine_run", stops_at_ngram)
    out = tmp_path / "decode.json"
    CliRunner().invoke(app, [*ARGS, "--target", str(tiny_dir), "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert "each method" in report["stage"]
    runs = report["by_dtype"]["float32"]["runs"]
    assert [r["name"] for r in runs] == ["engine-target-only", "hf-generate",
                                         "hf-generate-prompt-lookup(k=5)"]
    assert all(r["tokens_per_s"] > 0 for r in runs)

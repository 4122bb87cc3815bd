"""`autospec bench decode` says what it is doing: a line per prompt decoded by every method,
a line per run at the end, and partial JSON as it goes (tiny random-init target with
SmolLM2's tokenizer)."""

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
    assert "float32 prompt 1/1: decoded by each of 5 methods" in result.output
    for name in names:
        assert f"float32 {name}: " in result.output  # one progress line per run
    report = json.loads(out.read_text())
    assert report["complete"] is True and "stage" not in report
    assert [r["name"] for r in report["by_dtype"]["float32"]["runs"]] == names
    assert report["runs"] == report["by_dtype"]["float32"]["runs"]
    assert report["by_dtype"]["float32"]["verify_cost_ratio"]


def test_a_stopped_bench_decode_leaves_partial_json_tiny(
        tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped in the second prompt's round: the JSON holds every method's run over the
    first prompt, and says how many prompts those are."""
    real, calls = decode._engine_one, []

    def stops_in_round_2(engine, ids, max_new):  # type: ignore[no-untyped-def]
        calls.append(ids)
        if len({tuple(c) for c in calls}) > 1 and engine.speculator is not None:
            raise KeyboardInterrupt  # as a timeout or Ctrl-C would
        return real(engine, ids, max_new)

    monkeypatch.setattr(decode, "_engine_one", stops_in_round_2)
    out = tmp_path / "decode.json"
    args = [a if a != "1" else "2" for a in ARGS]  # --prompts 2
    CliRunner().invoke(app, [*args, "--target", str(tiny_dir), "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert "each method" in report["stage"]
    section = report["by_dtype"]["float32"]
    assert section["prompts_done"] == 1
    assert [r["name"] for r in section["runs"]] == [
        "engine-target-only", "hf-generate", "hf-generate-prompt-lookup(k=5)",
        "engine+ngram(k=5)", "engine+oracle(k=5)"]
    assert all(r["tokens_per_s"] > 0 for r in section["runs"])


def test_each_prompt_is_decoded_by_every_method_in_turn_order_reversed_tiny(
        tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Side by side: prompt by prompt, every method in turn, the order reversed every other
    prompt (the oracle last: it replays that prompt's target-only output)."""
    from autospec.engine.target import load_target

    target = load_target(str(tiny_dir), dtype="float32")
    order: list[str] = []
    real_engine, real_hf = decode._engine_one, decode._hf_one

    def engine_one(engine, ids, max_new):  # type: ignore[no-untyped-def]
        spec = engine.speculator
        order.append("target-only" if spec is None else spec.kind)
        return real_engine(engine, ids, max_new)

    def hf_one(target, ids, max_new, lookup):  # type: ignore[no-untyped-def]
        order.append(f"hf{lookup}")
        return real_hf(target, ids, max_new, lookup)

    monkeypatch.setattr(decode, "_engine_one", engine_one)
    monkeypatch.setattr(decode, "_hf_one", hf_one)
    prompts = [target.encode_chat(m) for m in decode.BENCH_PROMPTS[:2]]
    runs = decode.build_runs(target, prompts, 4, 5, ["ngram"], {})
    timed = order[2:]  # after the two warm-ups
    assert timed == ["target-only", "hf0", "hf5", "ngram", "oracle",
                     "ngram", "hf5", "hf0", "target-only", "oracle"]
    assert [r.name for r in runs][-1] == "engine+oracle(k=5)" and runs[-1].tau is not None

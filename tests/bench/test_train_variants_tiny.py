"""`autospec bench train --variants`: the base head and synthetic data beside the scratch head,
on the same held-out requests, with a cross-domain column (tiny random-init target with
SmolLM2's tokenizer, float32, so speculative outputs equal target-only ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.bench.train_variants import VARIANTS, parse_variants, variant_of
from autospec.cli import app
from tests.serve.helpers import make_tiny_model_dir

ALL = "scratch,synthetic,base,base+finetune"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def _args(tiny_dir: Path, work: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "train", "--target", str(tiny_dir), "--dtype", "float32",
            "--requests", "20", "--max-tokens", "8", "--kinds", "eagle3", "--epochs", "1",
            "--eval-requests", "2", "--draft-vocab-size", "128", "--synthetic-count", "4",
            "--workdir", str(work), "--json", str(out), *extra]


def _heads(work: Path) -> dict[str, store.Speculator]:
    engine = store.open_store(f"sqlite:///{work / 'traffic.db'}")
    try:
        with store.session_scope(engine, readonly=True) as session:
            rows = store.list_speculators(session, kind="eagle3", limit=100)
            heads = {variant_of(r.meta): r for r in rows}
            session.expunge_all()
        return heads
    finally:
        engine.dispose()


def test_every_variant_side_by_side_on_the_same_heldout_requests_tiny(
        tiny_dir: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "train.json"
    result = CliRunner().invoke(app, _args(tiny_dir, work, out, "--variants", ALL,
                                           "--other-domain", "coding"))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["complete"] is True
    methods = list(VARIANTS.values())
    for method in methods:
        assert f"{method} trained:" in result.output  # a line as each variant finishes
        assert f"coding: {method}: τ" in result.output
        figures = report["methods"][method]
        assert figures["identical_outputs"] == "2/2"  # greedy float32: the target's outputs
        assert report["other_domain"]["methods"][method]["identical_outputs"] == "2/2"
    assert "held-out top-1" in result.output  # each trained head's fit, on its line
    rows = report["by_variant"]
    assert list(rows) == list(VARIANTS)
    assert rows["scratch"]["tau_vs_scratch"] == pytest.approx(1.0)
    ngram = report["other_domain"]["methods"]["ngram"]["tau"]
    for variant, row in rows.items():
        tau = report["methods"][VARIANTS[variant]]["tau"]
        assert row["tau_vs_scratch"] == pytest.approx(tau / report["methods"]["eagle3"]["tau"])
        assert row["other_tau_vs_ngram"] == pytest.approx(row["other_tau"] / ngram)
    mixed = report["training"]["eagle3+synthetic"]["synthetic_sequences"]
    assert 1 <= mixed <= 4  # resampled train prompts only, never a held-out one's answer
    assert 0 <= report["heldout_prompts_in_synthetic"] <= 2
    assert 0 <= report["other_domain"]["prompts_in_synthetic"] <= 2
    assert "eagle3 variants on held-out support requests" in result.output


def test_the_finetuned_head_starts_from_the_base_head_tiny(tiny_dir: Path,
                                                           tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "train.json"
    result = CliRunner().invoke(app, _args(tiny_dir, work, out, "--variants",
                                           "base,base+finetune"))
    assert result.exit_code == 0, result.output
    heads = _heads(work)
    assert set(heads) == {"base", "base+finetune"}  # no scratch head was trained
    assert heads["base"].meta["base"] is True
    assert heads["base+finetune"].parent == heads["base"].version
    report = json.loads(out.read_text())
    assert "eagle3" not in report["methods"]
    assert "tau_vs_scratch" not in report["by_variant"]["base"]

    again = CliRunner().invoke(app, _args(tiny_dir, work, out, "--variants",
                                          "base,base+finetune", "--reuse"))
    assert again.exit_code == 0, again.output
    assert "eagle3-base reused" in again.output and "eagle3-base+finetune reused" in again.output
    assert {h.version for h in _heads(work).values()} == {h.version for h in heads.values()}


def test_a_base_directory_is_used_instead_of_pretraining_tiny(tiny_dir: Path,
                                                              tmp_path: Path) -> None:
    first = tmp_path / "first"
    CliRunner().invoke(app, _args(tiny_dir, first, tmp_path / "a.json", "--variants", "base"))
    base_dir = Path(_heads(first)["base"].artifact_uri)
    work, out = tmp_path / "work", tmp_path / "b.json"
    result = CliRunner().invoke(app, _args(tiny_dir, work, out, "--variants",
                                           "scratch,base", "--base", str(base_dir)))
    assert result.exit_code == 0, result.output
    assert set(_heads(work)) == {"scratch"}  # nothing pretrained in this run
    assert json.loads(out.read_text())["training"]["eagle3-base"]["version"] is None


def test_without_variants_the_bench_is_as_before_plus_the_other_domain_tiny(
        tiny_dir: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "train.json"
    result = CliRunner().invoke(app, [*_args(tiny_dir, work, out, "--other-domain", "json"),
                                      "--kinds", "suffix"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert list(report["methods"]) == ["target-only", "ngram", "suffix"]
    assert report["methods"]["target-only"]["tau"] == 1.0  # one token per target step
    assert list(report["other_domain"]["methods"]) == ["target-only", "ngram", "suffix"]
    assert report["by_variant"] == {} and "heldout_prompts_in_synthetic" not in report
    assert set(_heads(work)) == set()  # no eagle3 head of any variant


@pytest.mark.parametrize(("extra", "message"), [
    (["--variants", "scratch,teacher"], "known variants: scratch, synthetic, base, base+finetune"),
    (["--variants", "base,base"], "named twice"),
    (["--variants", "base", "--kinds", "suffix"], "add eagle3 to --kinds"),
    (["--other-domain", "support"], "must differ from --domain"),
    (["--other-domain", "poetry"], "known domains: coding, json, support"),
    (["--variants", "synthetic", "--synthetic-share", "1.0"], "--synthetic-share"),
])
def test_bad_input_is_refused_before_anything_loads(extra: list[str], message: str,
                                                    tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--target", str(tmp_path / "none"),
                                      *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())


def test_parse_variants_keeps_the_order_given() -> None:
    assert parse_variants(" base+finetune, scratch ") == ("base+finetune", "scratch")

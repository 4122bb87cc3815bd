"""An eagle3 head whose feature layers vLLM would read otherwise than autospec (not strictly
increasing, or above the target's depth N: vLLM sorts and de-duplicates them and collects
none above N) is neither exported nor served on vLLM; id N itself is fine (both read it
before the final norm), and so are the default ones from 3 layers up (tiny random-init
targets)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.interop.export import ExportError, export_speculator
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator, vllm_refusal
from tests.tiny import tiny_target

CHAINS = {"tree_nodes": 0, "suffix_threshold": None, "draft_vocab_size": 40}


@pytest.mark.parametrize(("layers", "depth"), [((1, 2, 3), 4), ((0, 1, 2), 3),
                                               ((1, 3, 5), 6), ((2, 15, 27), 30),
                                               ((1, 2, 4), 4), ((0, 1, 2), 2)])
def test_strictly_increasing_ids_up_to_the_depth_are_served_and_exported_tiny(
        layers, depth, tmp_path) -> None:
    target = tiny_target(num_layers=depth)
    spec = new_speculator("eagle3", target, feature_layers=layers, **CHAINS)
    assert vllm_refusal("eagle3", spec.config, target.info) is None
    export_speculator(spec, target, tmp_path / "out", k=3)


@pytest.mark.parametrize("depth", [3, 6])
def test_the_default_feature_layers_are_served_on_vllm_tiny(depth) -> None:
    """Were (1, 1, 2) and (2, 3, 3): vLLM de-duplicates them into fewer features than the
    head's fc takes."""
    target = tiny_target(num_layers=depth)
    spec = new_speculator("eagle3", target, **CHAINS)
    assert vllm_refusal("eagle3", spec.config, target.info) is None


@pytest.mark.parametrize(("layers", "depth", "fix"), [
    ((1, 1, 1), 2, "a < b < c <= 2"), ((3, 2, 1), 4, "a < b < c <= 4"),
    ((1, 1, 3), 4, "a < b < c <= 4"), ((1, 1, 1), 1, "serve it natively")])
def test_other_ids_are_refused_for_vllm_naming_them_tiny(layers, depth, fix,
                                                         tmp_path) -> None:
    target = tiny_target(num_layers=depth)
    spec = new_speculator("eagle3", target, feature_layers=layers, **CHAINS)
    why = vllm_refusal("eagle3", spec.config, target.info) or ""
    assert f"feature_layers {list(layers)} are not strictly increasing ids in [0, {depth}] " \
        f"(the target has {depth} layers)" in why and fix in why
    with pytest.raises(ExportError, match=r"cannot be exported for vLLM: its feature_layers"):
        export_speculator(spec, target, tmp_path / "out", k=3)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_export_of_a_2_layer_targets_default_head_is_one_line_exit_2_tiny(
        sqlite_url, tmp_path, monkeypatch) -> None:
    target = tiny_target(num_layers=2)
    spec = new_speculator("eagle3", target, **CHAINS)
    assert spec.config.feature_layers == (1, 1, 1)  # not (0, 1, 2): asked for explicitly
    sha = save_speculator(spec, tmp_path / "art")
    engine = store.open_store(sqlite_url, upgrade=True)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="e-1", kind="eagle3",
                                  target_id=target.info.target_id,
                                  target_revision=target.info.revision,
                                  artifact_uri=str(tmp_path / "art"), sha256=sha)
    engine.dispose()
    monkeypatch.setattr("autospec.engine.target.load_target", lambda *a, **k: target)
    done = CliRunner().invoke(app, ["export", "e-1", "--out", str(tmp_path / "out"),
                                    "--target", "tiny", "--url", sqlite_url])
    assert done.exit_code == 2, done.output
    assert len(done.output.strip().splitlines()) == 1, done.output  # no traceback
    assert "feature_layers [1, 1, 1]" in done.output and "a < b < c <= 2" in done.output
    assert not (tmp_path / "out").exists()

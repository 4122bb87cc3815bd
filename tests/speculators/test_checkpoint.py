"""Checkpoints: round trip, manifest checksums, and every refusal names its reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from autospec.engine.sampling import SamplingParams
from autospec.speculators.checkpoint import (
    SpeculatorLoadError,
    load_speculator,
    save_speculator,
    verify_manifest,
)
from autospec.speculators.registry import new_speculator

from .helpers import feed_from_scratch, target_features

KINDS = ["ngram", "draft", "eagle3"]
OVERRIDES = {"eagle3": {"draft_vocab_size": 32}, "draft": {}, "ngram": {}}


def _proposals(spec, target, sequence) -> list[list[int]]:
    layers = spec.feature_layers
    feats = target_features(target, sequence[:20], layers) if layers else None
    out = []
    for end in (12, 16, 20):
        feed_from_scratch(spec, sequence[:end], 8, None if feats is None else feats[:end])
        out.append(spec.propose(4, SamplingParams(), None).tokens.tolist())
    return out


def _rewrite_manifest(root: Path) -> None:
    """Recompute the manifest so that only the check under test can fail."""
    files = {n: hashlib.sha256((root / n).read_bytes()).hexdigest()
             for n in ("config.json", "model.safetensors")}
    digest = hashlib.sha256(
        json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (root / "manifest.json").write_text(json.dumps({"format": 1, "files": files,
                                                    "sha256": digest}))


@pytest.fixture()
def eagle_dir(tiny, tmp_path) -> Path:
    save_speculator(new_speculator("eagle3", tiny, **OVERRIDES["eagle3"]), tmp_path)
    return tmp_path


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_tiny_random_init_round_trip_gives_identical_proposals(
    tiny, sequence, tmp_path, kind
) -> None:
    spec = new_speculator(kind, tiny, **OVERRIDES[kind])
    if kind != "ngram":  # make the weights differ from a fresh build's
        with torch.no_grad():
            for tensor in spec.state_tensors().values():
                if tensor.is_floating_point():
                    tensor.add_(0.01 * torch.randn_like(tensor))
    digest = save_speculator(spec, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors"]
    assert verify_manifest(tmp_path) == digest
    loaded = load_speculator(tmp_path, tiny)
    assert loaded.kind == kind and loaded.config == spec.config
    assert _proposals(loaded, tiny, sequence) == _proposals(spec, tiny, sequence)


def test_checkpoint_manifest_format_is_the_documented_one(eagle_dir) -> None:
    manifest = json.loads((eagle_dir / "manifest.json").read_text())
    assert manifest["format"] == 1
    files = manifest["files"]
    for name, sha in files.items():
        assert hashlib.sha256((eagle_dir / name).read_bytes()).hexdigest() == sha
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    assert manifest["sha256"] == hashlib.sha256(canonical).hexdigest()


def test_checkpoint_config_carries_kind_target_and_hyperparameters(tiny, eagle_dir) -> None:
    config = json.loads((eagle_dir / "config.json").read_text())
    assert config["kind"] == "eagle3"
    assert config["target_id"] == tiny.info.target_id
    assert config["target_revision"] == tiny.info.revision
    assert config["draft_vocab_size"] == 32
    tensors = safetensors.torch.load_file(str(eagle_dir / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64 and tensors["d2t"].shape == (32,)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_checkpoint_tampered_byte_is_a_checksum_error(tiny, eagle_dir, name) -> None:
    path = eagle_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SpeculatorLoadError, match=f"{name}: sha256 mismatch"):
        load_speculator(eagle_dir, tiny)


@pytest.mark.parametrize("name", ["model.bin", "pytorch_model.pt", "state.pkl"])
def test_checkpoint_pickle_file_is_refused(tiny, eagle_dir, name) -> None:
    (eagle_dir / name).write_bytes(b"\x80\x04K\x01.")  # a pickle of 1
    with pytest.raises(SpeculatorLoadError, match="pickle"):
        load_speculator(eagle_dir, tiny)


def test_checkpoint_mismatched_target_is_refused(other_tiny, eagle_dir) -> None:
    with pytest.raises(SpeculatorLoadError, match="built for target 'tiny-llama-0'"):
        load_speculator(eagle_dir, other_tiny)


def test_checkpoint_wrong_tensor_shape_is_refused(tiny, eagle_dir) -> None:
    path = eagle_dir / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["fc.weight"] = torch.zeros(32, 64)
    safetensors.torch.save_file(tensors, str(path))
    _rewrite_manifest(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match=r"'fc.weight' has shape \(32, 64\)"):
        load_speculator(eagle_dir, tiny)


def test_checkpoint_missing_tensor_is_refused(tiny, eagle_dir) -> None:
    path = eagle_dir / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    del tensors["lm_head.weight"]
    safetensors.torch.save_file(tensors, str(path))
    _rewrite_manifest(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match=r"missing \['lm_head\.weight'\]"):
        load_speculator(eagle_dir, tiny)


def test_checkpoint_bad_draft_vocab_is_refused(tiny, eagle_dir) -> None:
    path = eagle_dir / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["d2t"][0] = 10_000
    safetensors.torch.save_file(tensors, str(path))
    _rewrite_manifest(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match="d2t"):
        load_speculator(eagle_dir, tiny)


@pytest.mark.parametrize("name", ["model.safetensors", "manifest.json"])
def test_checkpoint_missing_file_is_refused(tiny, eagle_dir, name) -> None:
    (eagle_dir / name).unlink()
    with pytest.raises(SpeculatorLoadError,
                       match=rf"has no {name}|{name} is listed in the manifest but missing"):
        load_speculator(eagle_dir, tiny)


def test_checkpoint_unknown_kind_lists_known_kinds(tiny, eagle_dir) -> None:
    config = json.loads((eagle_dir / "config.json").read_text())
    config["kind"] = "medusa"
    (eagle_dir / "config.json").write_text(json.dumps(config))
    _rewrite_manifest(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match="known kinds: draft, eagle3, ngram"):
        load_speculator(eagle_dir, tiny)


def test_checkpoint_invalid_config_field_is_named(tiny, eagle_dir) -> None:
    config = json.loads((eagle_dir / "config.json").read_text())
    config["ttt_step"] = 3
    (eagle_dir / "config.json").write_text(json.dumps(config))
    _rewrite_manifest(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match="ttt_step"):
        load_speculator(eagle_dir, tiny)


def test_speculators_never_unpickle() -> None:
    root = Path(__file__).resolve().parents[2] / "autospec" / "speculators"
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "torch.load(" not in text and "import pickle" not in text, path


@pytest.mark.parametrize(("kind", "field", "size", "tensor"), [
    ("eagle3", "intermediate_size", 10**15, "layer.gate_proj.weight"),
    ("eagle3", "suffix_tokens", 10**13, "suffix.suffix_array"),
    ("suffix", "corpus_tokens", 10**13, "tokens"),
    ("draft", "intermediate_size", 10**12, "model.layers.0.mlp.gate_proj.weight"),
])
def test_a_stored_config_of_sizes_its_weights_lack_is_refused_before_it_is_built(
        tiny, tmp_path, kind, field, size, tensor) -> None:
    """A registered version (a restored backup, say) whose config.json sets a size its
    weights do not have, manifest consistent: the speculator was built from the config
    first, so 10^15 was a RuntimeError (can't allocate memory) and 10^13 a MemoryError, not
    a refusal; a size that fits in memory would have been allocated."""
    save_speculator(new_speculator(kind, tiny, **OVERRIDES.get(kind, {})), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: size}))
    _rewrite_manifest(tmp_path)
    with pytest.raises(SpeculatorLoadError,
                       match=rf"(tensor '{tensor}' has shape .*, its config implies .*{size}"
                             rf"|missing \[.*'{tensor}'.*)"):
        load_speculator(tmp_path, tiny)


def test_checkpoint_directory_gone_is_named_missing(tiny, eagle_dir) -> None:
    """An artifact deleted by hand: every cycle's warm start failed with 'not a directory'
    of a path that is nothing at all."""
    import shutil

    shutil.rmtree(eagle_dir)
    with pytest.raises(SpeculatorLoadError, match=f"{eagle_dir}: missing"):
        load_speculator(eagle_dir, tiny)
    eagle_dir.write_text("")
    with pytest.raises(SpeculatorLoadError, match=f"{eagle_dir}: not a directory"):
        load_speculator(eagle_dir, tiny)

"""Save and load speculators as a directory: config, safetensors weights, SHA-256 manifest.

Layout of an artifact directory::

    config.json        the kind's config (kind, target_id, target_revision, hyperparameters)
    model.safetensors  the weights (float32; eagle3's draft vocabulary as ``d2t``;
                       empty for ngram); never the target's embedding
    manifest.json      {"format": 1,
                        "files": {"config.json": "<sha256>", "model.safetensors": "<sha256>"},
                        "sha256": sha256(json.dumps(files, sort_keys=True,
                                                    separators=(",", ":")))}

The top-level ``sha256`` is the artifact's identity (the store records it). Loading
refuses, each with a :class:`SpeculatorLoadError` naming the problem: a pickle-like file
(``*.bin``, ``*.pt``, ``*.pth``, ``*.pkl``, ``*.ckpt``), a missing file, a checksum
mismatch, an artifact SHA-256 other than the registered one (``expected_sha256``, which
every load of a registered version passes), an unknown kind or invalid config, a
different target (id or revision), and a missing, unexpected or wrongly shaped tensor.
Nothing is ever unpickled: weights are read with ``safetensors.torch.load_file`` only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pydantic
import safetensors
import safetensors.torch

from autospec import artifacts
from autospec.artifacts import MANIFEST as MANIFEST_FILE
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.files import WEIGHTS_FILE, refuse_pickles, save_tensors
from autospec.speculators.registry import build_speculator, kind, parse_config

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
EXPECTED_FILES = (CONFIG_FILE, WEIGHTS_FILE)


class SpeculatorLoadError(RuntimeError):
    """A speculator artifact was refused; the message says which file or field and why."""


# -- save ---------------------------------------------------------------------------------
def save_speculator(spec: SavableSpeculator, directory: str | Path) -> str:
    """Write ``spec`` to ``directory`` (created if needed); return the artifact sha256."""
    if not isinstance(spec, SavableSpeculator):
        raise TypeError(f"{type(spec).__name__} cannot be saved (not a SavableSpeculator)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = spec.config.model_dump(mode="json")
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_tensors(spec.state_tensors(), out / WEIGHTS_FILE)  # the mode config.json gets
    digest = artifacts.write_manifest(out, EXPECTED_FILES)
    log.info("saved %s speculator to %s (sha256 %s)", spec.kind, out, digest[:12])
    return digest


# -- manifest -----------------------------------------------------------------------------
def verify_manifest(directory: str | Path) -> str:
    """Check every checksum in ``directory``'s manifest; return the artifact sha256."""
    try:
        return artifacts.verify_manifest(directory, exactly=EXPECTED_FILES)
    except artifacts.ManifestError as exc:
        raise SpeculatorLoadError(str(exc)) from None


# -- load ---------------------------------------------------------------------------------
class ArtifactMismatch(SpeculatorLoadError):
    """A valid artifact, but not the one registered (its SHA-256 differs)."""


def load_speculator(directory: str | Path, target: Target, *,
                    expected_sha256: str | None = None,
                    float32: bool = False) -> SavableSpeculator:
    """Load a verified speculator for ``target``; :class:`SpeculatorLoadError` if refused.

    ``expected_sha256``: the artifact SHA-256 the registry recorded; an artifact whose own
    (consistent) manifest names another is refused with :class:`ArtifactMismatch`.
    ``float32``: hold the weights in float32 (:meth:`SavableSpeculator.hold_float32`), so
    they are the stored values exactly (a warm start), not their rounding to the target's
    dtype.
    """
    root = Path(directory)
    if not root.is_dir():
        raise SpeculatorLoadError(f"{root}: {'not a directory' if root.exists() else 'missing'}"
                                  " (a version's artifact is a directory of safetensors)")
    _refuse_pickles(root)
    digest = verify_manifest(root)
    if expected_sha256 is not None and digest != expected_sha256:
        raise ArtifactMismatch(f"{root}: artifact sha256 {digest[:16]}… is not the registered "
                               f"{expected_sha256[:16]}… (the files were replaced)")
    config = _read_config(root / CONFIG_FILE)
    info = target.info
    if config.target_id != info.target_id or not info.accepts_revision(config.target_revision):
        raise SpeculatorLoadError(
            f"{root}: built for target {config.target_id!r} revision {config.target_revision!r}, "
            f"not {info.target_id!r} revision {info.revision!r}"
        )
    _check_shapes(config, root / WEIGHTS_FILE)  # before the config's sizes are allocated
    try:
        spec = build_speculator(config, target)
    except ValueError as exc:
        raise SpeculatorLoadError(f"{root}: config does not fit the target: {exc}") from exc
    if float32:
        spec.hold_float32()
    _load_weights(spec, root / WEIGHTS_FILE)
    log.info("loaded %s speculator from %s (sha256 %s)", config.kind, root, digest[:12])
    return spec


def _refuse_pickles(root: Path) -> None:
    refuse_pickles(root, SpeculatorLoadError, f"speculator weights are loaded from "
                   f"{WEIGHTS_FILE} only. Remove the file to load this artifact.")
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name not in (*EXPECTED_FILES, MANIFEST_FILE):
            log.warning("ignoring unexpected file %s in speculator artifact", path)


def _read_config(path: Path):
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # too deep
        raise SpeculatorLoadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SpeculatorLoadError(f"{path}: expected a JSON object")
    try:
        return parse_config(data)
    except pydantic.ValidationError as exc:
        raise SpeculatorLoadError(f"{path}: invalid config: {exc}") from exc
    except ValueError as exc:  # unknown kind (lists the known ones)
        raise SpeculatorLoadError(f"{path}: {exc}") from exc


def _check_shapes(config, path: Path) -> None:  # type: ignore[no-untyped-def]
    """Refuse a weights file whose tensors are not the shapes ``config`` sets (its kind's
    ``shapes``), read from the file's header: a config of a size the weights do not have is
    refused before it is built (an ``intermediate_size`` of 10^15 was a RuntimeError)."""
    implied = kind(config.kind).shapes
    if implied is None:
        return
    try:
        with safetensors.safe_open(str(path), framework="pt") as fh:
            names = fh.keys()  # a safe_open handle is not iterable
            stored = {n: tuple(fh.get_slice(n).get_shape()) for n in names}
    except (safetensors.SafetensorError, OSError) as exc:
        raise SpeculatorLoadError(f"{path}: unreadable safetensors file ({exc})") from exc
    shapes = implied(config)
    missing = sorted(set(shapes) - set(stored))
    if missing:
        raise SpeculatorLoadError(f"{path}: tensors do not match a {config.kind} speculator: "
                                  f"missing {missing}")
    for name, shape in shapes.items():
        if stored[name] != shape:
            raise SpeculatorLoadError(f"{path}: tensor {name!r} has shape {stored[name]}, "
                                      f"its config implies {shape}")


def _load_weights(spec: SavableSpeculator, path: Path) -> None:
    try:
        tensors = safetensors.torch.load_file(str(path))
    except (safetensors.SafetensorError, OSError) as exc:
        raise SpeculatorLoadError(f"{path}: unreadable safetensors file ({exc})") from exc
    expected = spec.state_tensors()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise SpeculatorLoadError(
            f"{path}: tensors do not match a {spec.kind} speculator: "
            f"missing {missing}, unexpected {unexpected}"
        )
    for name, want in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise SpeculatorLoadError(
                f"{path}: tensor {name!r} has shape {tuple(got.shape)}, "
                f"expected {tuple(want.shape)}"
            )
        if got.is_floating_point() != want.is_floating_point():
            raise SpeculatorLoadError(f"{path}: tensor {name!r} has dtype {got.dtype}, "
                                      f"expected {want.dtype}")
    try:
        spec.load_tensors(tensors)
    except (ValueError, RuntimeError) as exc:
        raise SpeculatorLoadError(f"{path}: {exc}") from exc

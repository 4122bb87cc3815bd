"""Export a loaded speculator to what vLLM serves: files, a ``speculative_config``, a manifest.

:func:`export_speculator` writes into an empty directory ``out``, by kind
(:data:`EXPORTERS`, an explicit registry):

- ``eagle3``: ``config.json`` + ``model.safetensors`` in the vllm-project/speculators format
  (:mod:`autospec.speculators.speculators_format`); the head's traffic suffix index, if it
  has one, goes to the sidecar ``suffix-index/`` (its ``config.json`` and
  ``model.safetensors``) — a sub-directory, since vLLM loads every ``*.safetensors`` beside
  ``config.json``. vLLM runs the head's plain chains; the index and tree drafting are
  autospec's.
- ``draft``: a plain ``LlamaForCausalLM`` directory (the shared target embedding and LM head
  written out) with the target's tokenizer, for vLLM's ``draft_model`` method.
- ``ngram``: vLLM's ``ngram`` method (prompt lookup) with autospec's n-gram bounds.
- ``suffix``: the version's config and traffic index (``config.json``, ``model.safetensors``:
  corpus and suffix array) for vLLM's ``custom_class`` method with autospec's proposer
  (:mod:`autospec.interop.vllm_proposer`), which drafts what autospec's suffix speculator
  drafts.

Every export writes ``speculative_config.json`` (the JSON for vLLM's
``--speculative-config``) and ``manifest.json``: autospec's manifest format (per-file
SHA-256 and the export's SHA-256) plus ``source`` (the version, the artifact's SHA-256 and
its per-file checksums) and ``tensors`` (each exported tensor's SHA-256 and the artifact
tensor it was taken from: renamed tensors keep their bytes, so their checksums match the
artifact's). Knows nothing of the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from autospec import artifacts
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.draft import llama_config
from autospec.speculators.eagle3 import SUFFIX_PREFIX
from autospec.speculators.speculators_format import TENSOR_NAMES, to_speculators

log = logging.getLogger(__name__)

FORMATS = ("speculators",)
SPEC_CONFIG_FILE = "speculative_config.json"
SIDECAR_DIR = "suffix-index"
WEIGHTS = "model.safetensors"


class ExportError(ValueError):
    """The speculator cannot be exported; the message says why."""


@dataclass
class Exported:
    """What one exporter wrote: files (relative to ``out``), vLLM's config, notes."""

    speculative_config: dict[str, Any]
    files: list[str] = field(default_factory=list)
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class ExportResult:
    out: Path
    kind: str
    speculative_config: dict[str, Any]
    files: list[str]
    sha256: str
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "kind": self.kind, "files": self.files,
                "speculative_config": self.speculative_config, "sha256": self.sha256,
                "notes": self.notes}


def export_speculator(spec: SavableSpeculator, target: Target, out: str | Path, *, k: int,
                      source: dict[str, Any] | None = None,
                      fmt: str = "speculators") -> ExportResult:
    """Write ``spec`` for vLLM into ``out`` (created; must be empty); see the module doc.

    ``source``: the version's provenance for the manifest (version, sha256, files)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    exporter = EXPORTERS.get(spec.kind)
    if exporter is None:
        raise ExportError(f"a {spec.kind} speculator cannot be exported: vLLM has no method "
                          f"for it (exportable kinds: {', '.join(EXPORTERS)})")
    if k < 1:
        raise ExportError(f"num_speculative_tokens must be >= 1, got {k}")
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ExportError(f"{root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    try:
        done = exporter(spec, target, root.resolve(), k)
        (root / SPEC_CONFIG_FILE).write_text(json.dumps(done.speculative_config, indent=2) + "\n")
        files = sorted([*done.files, SPEC_CONFIG_FILE])
        digest = _write_manifest(root, files, done.tensors, source)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # it was empty: leave nothing half-written
        raise
    log.info("exported %s speculator to %s (%s)", spec.kind, root, ", ".join(files))
    return ExportResult(out=root.resolve(), kind=spec.kind, files=[*files, artifacts.MANIFEST],
                        speculative_config=done.speculative_config, sha256=digest,
                        notes=done.notes)


def _write_manifest(root: Path, files: list[str], tensors: dict[str, dict[str, str]],
                    source: dict[str, Any] | None) -> str:
    checksums = {name: artifacts.file_sha256(root / name) for name in files}
    digest = artifacts.files_digest(checksums)
    manifest = {"format": artifacts.MANIFEST_FORMAT, "files": checksums, "sha256": digest,
                "source": source or {}, "tensors": tensors}
    (root / artifacts.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return digest


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (CPU, contiguous), as stored in safetensors."""
    t = tensor.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file({n: _portable(t) for n, t in tensors.items()}, str(path),
                                metadata={"format": "pt"})


def _portable(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().to("cpu")
    return (tensor.float() if tensor.is_floating_point() else tensor).contiguous().clone()


def target_dir(target: Target) -> str:
    """The directory the target was loaded from (vLLM's verifier), or its id."""
    return str(getattr(target.model.config, "_name_or_path", "") or target.info.target_id)


# -- per kind -----------------------------------------------------------------------------
def _export_eagle3(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    state = {n: _portable(t) for n, t in spec.state_tensors().items()}
    index = {n.removeprefix(SUFFIX_PREFIX): state.pop(n) for n in list(state)
             if n.startswith(SUFFIX_PREFIX)}
    architectures = list(getattr(target.model.config, "architectures", None) or
                         [type(target.model).__name__])
    config, tensors = to_speculators(spec.config, state, num_speculative_tokens=k,
                                     verifier_path=target_dir(target),
                                     verifier_architectures=architectures)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _save(tensors, out / WEIGHTS)
    renamed = {v: k_ for k_, v in TENSOR_NAMES.items()}
    renamed.update({"d2t": "d2t (as offsets)", "t2d": "d2t (as a mask)"})
    sums = {n: {"sha256": tensor_sha256(t), "from": renamed[n]} for n, t in tensors.items()}
    done = Exported(speculative_config={"method": "eagle3", "model": str(out),
                                        "num_speculative_tokens": k},
                    files=["config.json", WEIGHTS], tensors=sums,
                    notes=["vLLM drafts chains of k from the head alone; autospec's tree "
                           "drafting and traffic suffix index are not part of the format"])
    if index:
        suffix = spec.suffix  # type: ignore[attr-defined]
        (out / SIDECAR_DIR).mkdir()
        (out / SIDECAR_DIR / "config.json").write_text(
            json.dumps(suffix.config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        _save(index, out / SIDECAR_DIR / WEIGHTS)
        done.files += [f"{SIDECAR_DIR}/config.json", f"{SIDECAR_DIR}/{WEIGHTS}"]
        done.tensors.update({f"{SIDECAR_DIR}/{n}": {"sha256": tensor_sha256(t),
                                                    "from": SUFFIX_PREFIX + n}
                             for n, t in index.items()})
        done.notes.append(f"the head's suffix index ({spec.config.suffix_tokens} tokens) is in "
                          f"{SIDECAR_DIR}/ for autospec import; vLLM does not read it")
    return done


def _export_draft(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    hf = llama_config(spec.config)
    hf.architectures = ["LlamaForCausalLM"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(hf, key, getattr(target.model.config, key, None))
    state = dict(spec.model.state_dict())  # type: ignore[attr-defined]  # shared ones included
    hf.save_pretrained(out)
    _save(state, out / WEIGHTS)
    files = ["config.json", WEIGHTS]
    if target.tokenizer is not None:
        before = {p.name for p in out.iterdir()}
        target.tokenizer.save_pretrained(out)
        files += sorted({p.name for p in out.iterdir() if p.is_file()} - before)
    sums = {n: {"sha256": tensor_sha256(_portable(t)), "from": n} for n, t in state.items()}
    return Exported(speculative_config={"method": "draft_model", "model": str(out),
                                        "num_speculative_tokens": k},
                    files=sorted(set(files)), tensors=sums)


def _export_ngram(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    c = spec.config
    return Exported(speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                        "prompt_lookup_max": c.max_ngram,
                                        "prompt_lookup_min": c.min_ngram})


def _export_suffix(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    from autospec.interop.vllm_proposer import CLASS_PATH, INDEX_ENV

    (out / "config.json").write_text(
        json.dumps(spec.config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    tensors = {n: t.contiguous() for n, t in spec.state_tensors().items()}
    _save(tensors, out / WEIGHTS)
    sums = {n: {"sha256": tensor_sha256(t), "from": n} for n, t in tensors.items()}
    return Exported(
        speculative_config={"method": "custom_class", "model": CLASS_PATH,
                            "num_speculative_tokens": k},
        files=["config.json", WEIGHTS], tensors=sums,
        notes=[f"vLLM runs autospec's suffix proposer ({CLASS_PATH}, method custom_class) "
               f"over this {spec.config.corpus_tokens}-token traffic index; autospec serve "
               f"loads it into the running engine, `vllm serve` reads it from the directory "
               f"named by {INDEX_ENV} (autospec must be installed beside vLLM)"])


EXPORTERS: dict[str, Callable[[SavableSpeculator, Target, Path, int], Exported]] = {
    "eagle3": _export_eagle3,
    "draft": _export_draft,
    "ngram": _export_ngram,
    "suffix": _export_suffix,
}

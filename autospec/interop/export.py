"""Export a loaded speculator to what vLLM serves: files, a ``speculative_config``, a manifest.

:func:`export_speculator` writes into an empty directory ``out`` with the kind's exporter
(``Kind.vllm.export``, declared by the kind's module: :mod:`autospec.speculators.registry`):

- ``eagle3``: the vllm-project/speculators format, the head's traffic suffix index in the
  sidecar ``suffix-index/`` (:mod:`autospec.speculators.eagle3.export`);
- ``draft``: a plain ``LlamaForCausalLM`` directory with the target's tokenizer, for vLLM's
  ``draft_model`` method;
- ``ngram``: vLLM's ``ngram`` method (prompt lookup) with autospec's n-gram bounds;
- ``suffix``: the version's config and traffic index for vLLM's ``custom_class`` method with
  autospec's proposer (:mod:`autospec.interop.vllm_proposer`), which drafts what autospec's
  suffix speculator drafts.

A kind without ``vllm`` support is refused (:class:`ExportError`), and so is what vLLM would
read otherwise than autospec (the kind's exporter says: an eagle3 head whose feature layers
vLLM reads differently). Every export writes
``speculative_config.json`` (the JSON for vLLM's
``--speculative-config``) and ``manifest.json``: autospec's manifest format (per-file
SHA-256 and the export's SHA-256) plus ``source`` (the version, the artifact's SHA-256 and
its per-file checksums) and ``tensors`` (each exported tensor's SHA-256 and the artifact
tensor it was taken from: renamed tensors keep their bytes, so their checksums match the
artifact's where the speculator was loaded in float32, as ``autospec export`` loads it; a
replica's own exports for its engine hold the speculator as loaded on the target's dtype,
rounded on a bfloat16 target as vLLM would round it). Knows nothing of the store.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autospec import artifacts
from autospec.engine.target import Target
from autospec.speculators import registry
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.kind import ExportError, target_dir

#: ExportError, target_dir: the kinds' error and helper, re-exported for the vLLM callers
__all__ = ["FORMATS", "SPEC_CONFIG_FILE", "ExportError", "ExportResult", "check_out_dir",
           "export_speculator", "target_dir"]

log = logging.getLogger(__name__)

FORMATS = ("speculators",)
SPEC_CONFIG_FILE = "speculative_config.json"


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
    vllm = registry.kind(spec.kind).vllm
    if vllm is None:
        exportable = [n for n, k in registry.KINDS.items() if k.vllm is not None]
        raise ExportError(f"a {spec.kind} speculator cannot be exported: vLLM has no method "
                          f"for it (exportable kinds: {', '.join(exportable)})")
    if k < 1:
        raise ExportError(f"num_speculative_tokens must be >= 1, got {k}")
    root = Path(out)
    check_out_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        done = vllm.export(spec, target, root.resolve(), k)
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


def check_out_dir(root: Path) -> None:
    """:class:`ExportError` unless ``root`` is a new or empty directory (the CLI asks before
    it loads the target; :func:`export_speculator` asks again)."""
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ExportError(f"{root} exists and is not an empty directory")


def _write_manifest(root: Path, files: list[str], tensors: dict[str, dict[str, str]],
                    source: dict[str, Any] | None) -> str:
    checksums = {name: artifacts.file_sha256(root / name) for name in files}
    digest = artifacts.files_digest(checksums)
    manifest = {"format": artifacts.MANIFEST_FORMAT, "files": checksums, "sha256": digest,
                "source": source or {}, "tensors": tensors}
    (root / artifacts.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return digest

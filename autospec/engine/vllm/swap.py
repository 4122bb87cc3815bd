"""Whether a version can be loaded into the running vLLM engine, and the load itself.

A running engine's speculator is described by a :class:`DraftShape`, read from what autospec
exported for it (:mod:`autospec.interop.export`): vLLM's method and ``k``; for a model
drafter (``eagle3``, ``draft_model``) its ``config.json`` and each tensor's name, dtype and
shape in ``model.safetensors`` (the safetensors header, no tensor read); for autospec's
proposer (``custom_class``) its class path; for ``ngram`` its lookup bounds.

:func:`in_place_refusal` says why a new version cannot go into the running engine (None: it
can): another method or ``k``, another architecture (``config.json`` differs: the keys
are named), other tensors or shapes. Any of these makes the swap start a second engine
(:class:`~autospec.serve.vllm_versions.VllmVersionManager`, which audits the reason).

:func:`load_in_place` moves the new version in between engine steps, through the worker
extension (:mod:`autospec.interop.vllm_worker`): new draft weights, a new suffix index, or
nothing (``ngram`` with the same bounds). Requests in flight keep decoding; steps after the
load draft with the new version (the verifier keeps every output exact either way). New
draft weights also reset vLLM's prefix cache (``VllmEngine.reset_prefix_cache``): its
blocks hold the draft model's KV as the old weights computed it, which a request whose
prefix is cached would draft from; the requests running are preempted and recomputed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autospec import artifacts

WEIGHTS = "model.safetensors"
#: config.json keys that name where or with what a model was written, not its shapes
_PROVENANCE_KEYS = ("_name_or_path", "transformers_version", "dtype", "torch_dtype")
_MODEL_METHODS = ("eagle3", "draft_model")


@dataclass(frozen=True)
class DraftShape:
    """What a vLLM engine drafts with, as far as an in-place load must match it."""

    method: str | None  # None: no speculation
    k: int = 0
    model: str | None = None  # custom_class: the proposer's class path
    ngram: tuple[int, int] | None = None  # ngram: (prompt_lookup_min, prompt_lookup_max)
    config: dict[str, Any] = field(default_factory=dict)  # model methods: config.json
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of each tensor in a safetensors file, from its header."""
    with path.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    return {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in header.items()
            if name != "__metadata__"}


def draft_shape(speculative_config: dict[str, Any] | None, out: Path | None) -> DraftShape:
    """The :class:`DraftShape` of an export (``out``: its directory, None for none)."""
    if not speculative_config:
        return DraftShape(None)
    method = str(speculative_config["method"])
    k = int(speculative_config["num_speculative_tokens"])
    if method == "ngram":
        return DraftShape(method, k, ngram=(int(speculative_config["prompt_lookup_min"]),
                                            int(speculative_config["prompt_lookup_max"])))
    if method == "custom_class":
        return DraftShape(method, k, model=str(speculative_config["model"]))
    if method in _MODEL_METHODS and out is not None:
        config = json.loads((out / "config.json").read_text())
        config = {key: v for key, v in config.items() if key not in _PROVENANCE_KEYS}
        return DraftShape(method, k, config=config, tensors=safetensors_header(out / WEIGHTS))
    return DraftShape(method, k)


def in_place_refusal(running: DraftShape, new: DraftShape) -> str | None:
    """Why ``new`` cannot be loaded into an engine drafting with ``running`` (None: it can)."""
    if running.method is None or new.method is None:
        return "speculation is switched on or off"
    if running.method != new.method:
        return f"vLLM method {running.method} -> {new.method} (another kind)"
    if running.k != new.k:
        return f"num_speculative_tokens {running.k} -> {new.k}"
    if new.method == "ngram":
        return None if running.ngram == new.ngram else \
            f"n-gram bounds {running.ngram} -> {new.ngram}"
    if new.method == "custom_class":
        return None if running.model == new.model else f"proposer {running.model} -> {new.model}"
    if new.method not in _MODEL_METHODS:
        return f"vLLM method {new.method} has no in-place load"
    keys = sorted(k for k in running.config.keys() | new.config.keys()
                  if running.config.get(k) != new.config.get(k))
    if keys:
        return f"the draft model's config differs ({', '.join(keys)})"
    if running.tensors != new.tensors:
        changed = sorted(n for n in running.tensors.keys() | new.tensors.keys()
                         if running.tensors.get(n) != new.tensors.get(n))
        return f"the draft model's tensors differ in name or shape ({', '.join(changed[:4])})"
    return None


def load_in_place(engine: Any, shape: DraftShape, out: Path | None,
                  version: str) -> dict[str, Any]:
    """Load the export in ``out`` (of ``shape``, accepted by :func:`in_place_refusal`) into
    the running ``engine``; returns what the workers report, and ``seconds``."""
    started = time.perf_counter()
    if shape.method in _MODEL_METHODS:
        assert out is not None
        sha = artifacts.file_sha256(out / WEIGHTS)
        reports = engine.rpc("autospec_reload_draft", str(out / WEIGHTS), sha)
        engine.reset_prefix_cache()  # cached blocks hold the old draft model's KV
    elif shape.method == "custom_class":
        assert out is not None
        reports = _load_index(engine, out, version, None)
    else:
        reports = []  # ngram with the same bounds: nothing to load
    return {"workers": reports, "seconds": time.perf_counter() - started}


def load_slot(engine: Any, out: Path, version: str) -> dict[str, Any]:
    """Load the suffix export in ``out`` into the running ``engine``'s custom proposer as
    the slot ``version`` (the requests of a segment drafted by it); workers' reports and
    ``seconds``."""
    started = time.perf_counter()
    reports = _load_index(engine, out, version, version)
    return {"workers": reports, "seconds": time.perf_counter() - started}


def _load_index(engine: Any, out: Path, version: str, slot: str | None) -> list[Any]:
    """The suffix index exported in ``out`` into ``engine``'s custom proposer (its files'
    checksums sent along): every request's (``slot`` None), or ``slot``'s."""
    sums = {name: artifacts.file_sha256(out / name) for name in ("config.json", WEIGHTS)}
    slotted = () if slot is None else (slot,)
    return engine.rpc("autospec_load_index", str(out), sums, version, *slotted)


def drop_slot(engine: Any, version: str) -> list[Any]:
    """Forget the slot ``version`` in the running ``engine``'s custom proposer."""
    return engine.rpc("autospec_drop_index", version)

"""Import a speculators-format EAGLE-3 head as a version of the loaded target.

:func:`import_head` reads ``DIR/config.json`` and ``DIR/model.safetensors`` (safetensors
only: a pickle-format file in ``DIR`` is refused, nothing is unpickled; a ``manifest.json``
written by ``autospec export`` is verified), converts them
(:func:`autospec.speculators.speculators_format.from_speculators`), and checks them against
the target: hidden size, vocabulary, aux layer ids, the verifier's architecture, and the
head's own embedding table if it ships one (autospec heads use the target's). A sidecar
``suffix-index/`` written by ``autospec export`` comes back as the head's suffix index, and
the export's ``autospec-settings.json`` as the head's own settings (tree drafting, the index
threshold...: the format has no field for them). A head from elsewhere has no such file and
gets the config's defaults; ``settings`` (``autospec import --set``) override either, e.g.
``tree_nodes=0`` for a head vLLM can serve.

The head is then built and loaded as an :class:`~autospec.speculators.eagle3.Eagle3Speculator`
(so it serves and warm-starts training like a trained one), saved as an autospec artifact
under the artifact directory (on disk, renamed included, before the transaction commits:
:mod:`autospec.durable`), registered as a ``candidate`` and audited with an ``import``
event in the same transaction. A transaction that fails removes the artifact unless the
version is registered with it after all (a COMMIT that landed though it raised) or the store
cannot say (it then stays, an orphan the next name skips; the import's own error is raised).
Every refusal is an :class:`ImportRefused` naming what is wrong; a symbolic link inside the
directory is one (:func:`refuse_links`; a Hugging Face cache snapshot's links to its blobs
excepted): nothing outside it is read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import safetensors
import safetensors.torch
import torch
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from autospec import artifacts, store
from autospec.durable import sync_renamed, sync_tree
from autospec.engine.target import Target
from autospec.settings import get_settings
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.config import SuffixConfig
from autospec.speculators.eagle3 import KIND as EAGLE3
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.eagle3.export import SETTINGS, SETTINGS_FILE, SIDECAR_DIR
from autospec.speculators.files import refuse_pickles
from autospec.speculators.overrides import FIXED, parse_overrides, validate_settings
from autospec.speculators.speculators_format import FormatError, embed_table, from_speculators
from autospec.speculators.suffix import SEPARATOR, SuffixSpeculator
from autospec.store.artifacts import inside

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # the registry's rule, checked first
#: the settings ``autospec import --set`` takes (the rest of the config is the head's layout)
SETTABLE = tuple(n for n in SETTINGS if n not in FIXED)


class ImportRefused(ValueError):
    """The directory cannot be imported for this target; the message says why."""


@dataclass
class Imported:
    version: str
    artifact: Path
    sha256: str
    source: str
    details: dict[str, Any]


def parse_settings(assignments: list[str]) -> dict[str, Any]:
    """``autospec import --set key=value`` → validated settings (keys among :data:`SETTABLE`)."""
    return parse_overrides(EAGLE3.name, assignments, allowed=SETTABLE, error=ImportRefused)


def read_head(directory: str | Path, target: Target,
              settings: Mapping[str, Any] | None = None) -> Eagle3Speculator:
    """The head in ``directory``, checked against ``target`` and loaded (nothing written);
    ``settings`` (keys among :data:`SETTABLE`) override its stored ones or the defaults."""
    root = Path(directory)
    if not root.is_dir():
        raise ImportRefused(f"{root}: not a directory")
    refuse_links(root)
    refuse_pickles(root, ImportRefused, "only safetensors weights are imported. Remove it to "
                   "import.")
    if (root / artifacts.MANIFEST).exists():
        try:
            artifacts.verify_manifest(root, required=("config.json", "model.safetensors"))
        except artifacts.ManifestError as exc:
            raise ImportRefused(str(exc)) from None
    data = _read_json(root / "config.json")
    tensors = _read_tensors(root / "model.safetensors")
    _check_verifier(data, target)
    info = target.info
    try:
        config, head = from_speculators(
            data, tensors, target_id=info.target_id, target_revision=info.revision,
            target_vocab_size=info.vocab_size, target_hidden_size=info.hidden_size,
            target_num_layers=info.num_layers)
    except (FormatError, pydantic.ValidationError) as exc:
        raise ImportRefused(f"{root}: {exc}") from None
    given = validate_settings(EAGLE3.name, settings or {}, allowed=SETTABLE,
                              error=ImportRefused, where="--set ")
    config = config.model_copy(update={**_read_settings(root), **given})
    _check_embedding(embed_table(tensors), target, root)
    spec = Eagle3Speculator(config, target)
    spec.hold_float32()  # imported and stored at full precision, whatever the target's dtype
    try:
        spec.load_tensors(_shaped(head, spec))
    except (ValueError, RuntimeError) as exc:
        raise ImportRefused(f"{root}: {exc}") from None
    if (root / SIDECAR_DIR).is_dir():
        spec.attach_suffix(_read_index(root / SIDECAR_DIR, target))
    return spec.to(target.device)


def check_name(engine: Engine | None, name: str | None) -> None:
    """A version name given for an import (``None``: the next eagle3 name, nothing to check)
    follows the registry's rule and, given the store's ``engine``, is free: not registered,
    no artifact directory of that name (an :class:`ImportRefused` or
    :class:`~autospec.store.Conflict`). Cheap: ``autospec import`` asks before the target
    loads (the name's form before it opens the store)."""
    if name is None:
        return
    if not _NAME.fullmatch(name):
        raise ImportRefused(f"invalid version name {name!r}: use 1-64 letters, digits, '.', "
                            f"'_' or '-', starting with a letter or digit")
    if engine is None:
        return
    with store.session_scope(engine, readonly=True) as session:
        try:
            store.get_speculator(session, version=name)
        except store.NotFound:
            pass
        else:
            raise store.Conflict(f"speculator version {name!r} is already registered")
    there = inside(get_settings().resolved_artifact_dir, name)
    if there.exists():
        raise store.Conflict(f"artifact directory {there} already exists")


def import_head(directory: str | Path, *, target: Target, engine: Engine,
                name: str | None = None, actor: str = "cli",
                settings: Mapping[str, Any] | None = None) -> Imported:
    """Register the head in ``directory`` as a candidate version; see the module doc."""
    check_name(engine, name)
    spec = read_head(directory, target, settings)
    source = str(Path(directory).resolve())
    root = get_settings().resolved_artifact_dir
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".partial-{uuid.uuid4().hex}"
    final: Path | None = None
    created = False  # only a directory this call moved into place is ever removed
    details = {"source": source, "draft_vocab_size": spec.config.draft_vocab_size,
               "feature_layers": list(spec.config.feature_layers),
               "norm_before_residual": spec.config.norm_before_residual,
               "suffix_tokens": spec.config.suffix_tokens,
               "settings": {n: getattr(spec.config, n) for n in SETTINGS}}
    try:
        sha = save_speculator(spec, tmp)
        sync_tree(tmp)  # on disk before the transaction names it (and takes the write lock)
        with store.session_scope(engine) as session:
            # a folder already named like the next version (an import or registration in
            # doubt, a store reset) is never overwritten: the version takes the next free name
            version = name or store.next_version(
                session, kind=EAGLE3.name, taken=lambda n: inside(root, n).exists())
            final = inside(root, version)
            if final.exists():
                raise store.Conflict(f"artifact directory {final} already exists")
            tmp.rename(final)
            created = True
            sync_renamed(final)  # the rename too, before the COMMIT
            info = target.info
            store.register_speculator(
                session, version=version, kind=EAGLE3.name, target_id=info.target_id,
                target_revision=info.revision, artifact_uri=str(final), sha256=sha,
                draft_vocab_size=spec.config.draft_vocab_size,
                meta={"imported": details}, actor=actor)
            store.record_event(session, kind="import", actor=actor, version=version,
                               reason=f"imported from {source}", details={**details,
                                                                          "sha256": sha})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and final is not None and _registered(engine, final, sha) is False:
            shutil.rmtree(final, ignore_errors=True)
        raise
    log.info("imported %s as %s (%s)", source, version, final)
    return Imported(version=version, artifact=final, sha256=sha, source=source,
                    details=details)


def _registered(engine: Engine, path: Path, sha: str) -> bool | None:
    """Whether the import's version is registered with the artifact at ``path`` (its COMMIT
    may have landed though it raised); None, logged, when the store cannot say: the artifact
    then stays (an orphan the next name skips, never a registered version without files)
    and the import's own error is the one raised."""
    try:
        with store.session_scope(engine, readonly=True) as session:
            return store.registered_with(session, path, sha)
    except (SQLAlchemyError, store.StoreError, OSError) as exc:
        log.warning("cannot tell whether the import of %s registered %s (%s); its artifact "
                    "stays at %s", path.name, path.name, exc, path)
        return None


def refuse_links(root: Path) -> None:
    """:class:`ImportRefused` naming the first symbolic link inside ``root`` (a file or a
    folder; ``root`` itself may be one): an import reads the head's own files, never what a
    link points at, wherever that is — except a Hugging Face cache snapshot's links to its
    own repository's blobs (:func:`_cache_blobs`), which hold the snapshot's files."""
    blobs = _cache_blobs(root)
    for folder, dirs, files in os.walk(root):  # a linked folder is listed, not entered
        for name in sorted([*dirs, *files]):
            path = Path(folder) / name
            if path.is_symlink() and not _a_blob(path, blobs):
                raise ImportRefused(f"{path}: a symbolic link (to {os.readlink(path)}): "
                                    f"refused, an import reads nothing outside {root} (or, "
                                    f"for a Hugging Face cache snapshot, its repository's "
                                    f"blobs); copy the file in its place")


def _cache_blobs(root: Path) -> Path | None:
    """``<repo>/blobs`` where ``root`` is a Hugging Face cache snapshot
    (``<cache>/models--ORG--NAME/snapshots/<revision>``: its files link to ``../../blobs``),
    else None."""
    real = root.resolve()
    repo = real.parent.parent
    if real.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    return repo / "blobs"


def _a_blob(path: Path, blobs: Path | None) -> bool:
    """Whether the link ``path`` leads to a regular file directly in ``blobs``."""
    if blobs is None:
        return False
    target = path.resolve()
    return target.parent == blobs.resolve() and target.is_file()


def refuse_unless_file(path: Path) -> None:
    """:class:`ImportRefused` naming ``path`` when something other than a regular file is
    there (a directory, a named pipe, whose read would block for ever, a device, a broken
    link); nothing there is the caller's to say."""
    if (path.exists() or path.is_symlink()) and not path.is_file():
        raise ImportRefused(f"{path}: not a file (a directory, a named pipe, a device or a "
                            f"broken link)")


def _read_json(path: Path) -> dict[str, Any]:
    refuse_unless_file(path)
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ImportRefused(f"{path.parent}: no config.json (not a speculators directory)") \
            from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # too deep
        raise ImportRefused(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path}: expected a JSON object")
    return data


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    refuse_unless_file(path)
    if not path.is_file():
        shards = sorted(p.name for p in path.parent.glob("*.safetensors"))
        hint = f" (found {shards}; sharded heads are not supported)" if shards else ""
        raise ImportRefused(f"{path.parent}: no model.safetensors{hint}")
    try:
        return safetensors.torch.load_file(str(path))
    except (safetensors.SafetensorError, OSError) as exc:
        raise ImportRefused(f"{path}: unreadable safetensors file ({exc})") from None


def _read_settings(root: Path) -> dict[str, Any]:
    """The head's own settings ``autospec export`` wrote (:data:`SETTINGS_FILE`); {} for a
    head from elsewhere (it gets the config's defaults)."""
    path = root / SETTINGS_FILE
    if not path.exists():
        return {}
    data = _read_json(path)
    if data.get("kind") != EAGLE3.name or not isinstance(data.get("settings"), dict):
        raise ImportRefused(f'{path}: expected {{"kind": "eagle3", "settings": {{...}}}}')
    return validate_settings(EAGLE3.name, data["settings"], allowed=SETTINGS,
                             error=ImportRefused, where=f"{path}: ")


def _check_verifier(data: dict[str, Any], target: Target) -> None:
    verifier = _object(_object(data, "speculators_config"), "verifier",
                       "speculators_config.")
    theirs = verifier.get("architectures") or []
    if not isinstance(theirs, list) or not all(isinstance(a, str) for a in theirs):
        raise ImportRefused(f"speculators_config.verifier.architectures must be a list of "
                            f"names, got {theirs!r}")
    ours = list(getattr(target.model.config, "architectures", None) or
                [type(target.model).__name__])
    if theirs and not set(theirs) & set(ours):
        raise ImportRefused(f"the head's verifier is a {theirs} model "
                            f"({verifier.get('name_or_path')}); the target is {ours}")
    if verifier.get("name_or_path"):
        log.info("head trained for verifier %s; importing for %s", verifier["name_or_path"],
                 target.info.target_id)


def _object(data: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    """``data[key]``, which must be a JSON object ({} if absent or null)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ImportRefused(f"{where}{key} must be an object, got {value!r}")
    return value


def _check_embedding(embed: torch.Tensor | None, target: Target, root: Path) -> None:
    if embed is None:
        return
    ours = target.model.get_input_embeddings().weight.detach().float().cpu()
    if tuple(embed.shape) != tuple(ours.shape) or not torch.allclose(
            embed.float(), ours, rtol=1e-2, atol=1e-3):
        raise ImportRefused(f"{root}: embed_tokens.weight differs from the target's embedding "
                            f"(autospec heads use the target's table): another verifier?")


def _shaped(head: dict[str, torch.Tensor], spec: Eagle3Speculator) -> dict[str, torch.Tensor]:
    want = spec.head.state_dict()
    for name, tensor in head.items():
        if tuple(tensor.shape) != tuple(want[name].shape):
            raise ImportRefused(f"tensor {name} has shape {tuple(tensor.shape)}, the config "
                                f"implies {tuple(want[name].shape)}")
    return head


#: the tensors of a suffix index sidecar, each 1-D
INDEX_TENSORS = ("tokens", "suffix_array")


def _read_index(path: Path, target: Target) -> SuffixSpeculator:
    """The suffix index in the sidecar ``path``; ImportRefused naming the file and what is
    wrong with it."""
    config = path / "config.json"
    refuse_unless_file(config)
    try:
        data = json.loads(config.read_text("utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportRefused(f"{path}: not a suffix index sidecar ({exc})") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path / 'config.json'}: expected a JSON object (the suffix "
                            f"index's config), got {type(data).__name__}")
    tensors = _read_tensors(path / "model.safetensors")
    missing = [n for n in INDEX_TENSORS if n not in tensors]
    flat = [n for n in INDEX_TENSORS if n in tensors and tensors[n].dim() != 1]
    if missing or flat:
        raise ImportRefused(f"{path / 'model.safetensors'}: a suffix index needs 1-D tensors "
                            f"{', '.join(INDEX_TENSORS)}; missing {missing}, not 1-D {flat}")
    _check_index(path, data, tensors, target.info.vocab_size)
    try:
        info = target.info
        config = SuffixConfig(**{**data, "target_id": info.target_id,
                                 "target_revision": info.revision})
        index = SuffixSpeculator(config, target)
        index.load_tensors(tensors)
    except (pydantic.ValidationError, ValueError, RuntimeError) as exc:
        raise ImportRefused(f"{path}: not a suffix index sidecar ({exc})") from None
    return index


def _check_index(path: Path, data: dict[str, Any], tensors: dict[str, torch.Tensor],
                 vocab_size: int) -> None:
    """Refuse (naming the file) a sidecar whose ``corpus_tokens`` is not its ``tokens``'
    length (the index is allocated from it before the tensors are read: 10^13 was a
    MemoryError), whose tensors are not integers, or whose tokens are not target ids (or the
    separator, -1): they would be proposed as drafts."""
    weights = path / "model.safetensors"
    floats = [n for n in INDEX_TENSORS if tensors[n].is_floating_point() or
              tensors[n].is_complex() or tensors[n].dtype == torch.bool]
    if floats:
        raise ImportRefused(f"{weights}: {', '.join(floats)} must hold integers, not "
                            f"{', '.join(str(tensors[n].dtype) for n in floats)}")
    tokens = tensors["tokens"]
    if data.get("corpus_tokens", 0) != tokens.numel():
        raise ImportRefused(f"{path / 'config.json'}: corpus_tokens is "
                            f"{data.get('corpus_tokens', 0)!r}, its tokens hold {tokens.numel()}")
    if tokens.numel() and (int(tokens.min()) < SEPARATOR or int(tokens.max()) >= vocab_size):
        raise ImportRefused(f"{weights}: tokens holds ids outside [0, {vocab_size}) (the "
                            f"target's vocabulary; {SEPARATOR} separates documents): "
                            f"{int(tokens.min())} to {int(tokens.max())}")

"""An ``eagle3`` head for vLLM: the vllm-project/speculators format, and what vLLM cannot run.

:func:`export_eagle3` writes ``config.json`` + ``model.safetensors`` in the speculators
format (:mod:`autospec.speculators.speculators_format`); the head's traffic suffix index,
if it has one, goes to the sidecar ``suffix-index/`` (its ``config.json`` and
``model.safetensors``) — a sub-directory, since vLLM loads every ``*.safetensors`` beside
``config.json`` — for ``autospec import``; autospec's own settings of the head, which the
format has no field for (:data:`SETTINGS`: tree drafting, the index threshold...), go to
``autospec-settings.json`` beside ``config.json`` (vLLM does not read it), which ``autospec
import`` restores. vLLM runs the head's plain chains:
:func:`vllm_refusal` says why a head drafting trees or consulting its index cannot be
served there (a candidate trained for vLLM is trained without both: ``KIND.vllm.overrides``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from autospec.engine.info import TargetInfo
from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.eagle3.speculator import SUFFIX_PREFIX, Eagle3Speculator
from autospec.speculators.files import WEIGHTS_FILE, portable, save_tensors, tensor_sha256
from autospec.speculators.kind import Exported, ExportError, target_dir
from autospec.speculators.speculators_format import TENSOR_NAMES, to_speculators

#: the sub-directory of an export holding the head's suffix index
SIDECAR_DIR = "suffix-index"
#: the file of an export holding autospec's own settings of the head
SETTINGS_FILE = "autospec-settings.json"
#: the head's settings the speculators format has no field for (``suffix_tokens`` is the
#: index's size, restored with the index)
SETTINGS = ("ttt_steps", "suffix_threshold", "suffix_carried_tokens", "tree_nodes",
            "tree_min_prob", "tree_width")


def export_eagle3(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    """The head in the speculators format, its index in the sidecar; see the module doc."""
    assert isinstance(spec, Eagle3Speculator)
    if (why := feature_layers_refusal(spec.config.feature_layers, target.info)) is not None:
        raise ExportError(f"this eagle3 head cannot be exported for vLLM: {why}")
    state = {n: portable(t) for n, t in spec.state_tensors().items()}
    index = {n.removeprefix(SUFFIX_PREFIX): state.pop(n) for n in list(state)
             if n.startswith(SUFFIX_PREFIX)}
    architectures = list(getattr(target.model.config, "architectures", None) or
                         [type(target.model).__name__])
    config, tensors = to_speculators(spec.config, state, num_speculative_tokens=k,
                                     verifier_path=target_dir(target),
                                     verifier_architectures=architectures)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    settings = {n: getattr(spec.config, n) for n in SETTINGS}
    (out / SETTINGS_FILE).write_text(json.dumps({"kind": spec.kind, "settings": settings},
                                                indent=2, sort_keys=True) + "\n")
    save_tensors(tensors, out / WEIGHTS_FILE)
    renamed = {v: k_ for k_, v in TENSOR_NAMES.items()}
    renamed.update({"d2t": "d2t (as offsets)", "t2d": "d2t (as a mask)"})
    sums = {n: {"sha256": tensor_sha256(t), "from": renamed[n]} for n, t in tensors.items()}
    done = Exported(speculative_config={"method": "eagle3", "model": str(out),
                                        "num_speculative_tokens": k},
                    files=["config.json", SETTINGS_FILE, WEIGHTS_FILE], tensors=sums,
                    notes=["vLLM drafts chains of k from the head alone; autospec's tree "
                           "drafting and traffic suffix index are not part of the format"])
    if index:
        _export_index(spec, index, out, done)
    return done


def _export_index(spec: Eagle3Speculator, index: dict[str, Any], out: Path,
                  done: Exported) -> None:
    assert spec.suffix is not None
    (out / SIDECAR_DIR).mkdir()
    (out / SIDECAR_DIR / "config.json").write_text(
        json.dumps(spec.suffix.config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    save_tensors(index, out / SIDECAR_DIR / WEIGHTS_FILE)
    done.files += [f"{SIDECAR_DIR}/config.json", f"{SIDECAR_DIR}/{WEIGHTS_FILE}"]
    done.tensors.update({f"{SIDECAR_DIR}/{n}": {"sha256": tensor_sha256(t),
                                                "from": SUFFIX_PREFIX + n}
                         for n, t in index.items()})
    done.notes.append(f"the head's suffix index ({spec.config.suffix_tokens} tokens) is in "
                      f"{SIDECAR_DIR}/ for autospec import; vLLM does not read it")


def feature_layers_refusal(layers: Sequence[int], info: TargetInfo) -> str | None:
    """Why vLLM would feed a head of feature ``layers`` on the target of ``info`` other
    hidden states than autospec does (None: the same ones).

    Both number them alike (:mod:`autospec.engine.feature_layers`: id N, the target's depth,
    is the last layer's output before the final norm), but vLLM sorts and de-duplicates the
    ids and collects none above N: only strictly increasing ids in ``[0, N]`` reach the
    head's ``fc`` as they do on autospec's engine."""
    ids, depth = tuple(layers), info.num_layers
    if all(a < b for a, b in pairwise(ids)) and all(0 <= i <= depth for i in ids):
        return None
    fix = f"train it with --set feature_layers=[a, b, c], a < b < c <= {depth}" \
        if depth >= 2 else f"a {depth}-layer target has no three such ids: serve it natively"
    return (f"its feature_layers {list(ids)} are not strictly increasing ids in [0, {depth}] "
            f"(the target has {depth} layers), and vLLM reads them sorted, de-duplicated and "
            f"none above {depth}, so it would feed the head other features; {fix}")


def vllm_refusal(config: Any, info: TargetInfo) -> str | None:
    """Why a head of ``config`` cannot be served on vLLM for the target of ``info`` (None:
    it can)."""
    if (why := feature_layers_refusal(config.feature_layers, info)) is not None:
        return f"this eagle3 version cannot be served on vLLM: {why}"
    if getattr(config, "tree_nodes", 0):
        return (f"this eagle3 version drafts trees (tree_nodes={config.tree_nodes}); "
                "vLLM drafts chains of k from the head: train it with tree_nodes 0")
    if getattr(config, "suffix_threshold", None) is not None and \
            getattr(config, "suffix_tokens", 0):
        return ("this eagle3 version consults its traffic suffix index "
                f"(suffix_threshold={config.suffix_threshold}); vLLM runs the head in its "
                "own EAGLE proposer, which takes no index, and a custom proposer sees "
                "token ids, not the target's hidden states: train it with "
                "suffix_threshold null")
    return None

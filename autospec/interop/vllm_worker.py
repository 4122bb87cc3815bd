"""What autospec runs inside vLLM's worker: the in-place swap of a running engine's speculator.

:class:`AutospecWorkerExtension` is vLLM's ``worker_extension_cls`` for every engine autospec
starts: vLLM mixes it into its worker class, and ``collective_rpc("autospec_…")`` calls its
methods between engine steps (the engine core runs one utility call or one step at a time,
so no forward pass sees a half-loaded speculator). Two moves, one per kind of drafter:

- :meth:`~AutospecWorkerExtension.autospec_reload_draft`: new weights for the draft model
  (an ``eagle3`` head or a ``draft`` model) of the same shapes, through vLLM's own in-place
  reload (:func:`vllm.model_executor.model_loader.reload.inplace.reload_weights`: layerwise loading,
  then the layers' ``process_weights_after_loading`` — on a CPU that repacks the linear
  weights for oneDNN, so a plain ``copy_`` into the parameters would not be seen). The draft
  model is vLLM's :meth:`Worker.get_draft_model` (the accessor its weight-transfer engines
  use). Tensors the draft shares with the target (the embedding, and the LM head when the
  draft vocabulary is the target's) are never written: an incoming one must equal the
  target's, else the swap is refused and nothing is changed.
- :meth:`~AutospecWorkerExtension.autospec_load_index`: a new traffic index for autospec's
  custom proposer (:class:`autospec.interop.vllm_proposer.SuffixIndexProposer`), which it
  also attaches to the model runner (each row's request, so drafts stop at its end) — the
  deployment's, or a segment version's in a slot of its own
  (:meth:`~AutospecWorkerExtension.autospec_drop_index` forgets one).

And two calls at the engine's start: :meth:`~AutospecWorkerExtension.autospec_cap_drafts`:
whatever proposer drafts, its drafts stop where the request can end, so vLLM's per-request
counts are the emitted ones (:mod:`autospec.interop.vllm_request_end`);
:meth:`~AutospecWorkerExtension.autospec_weight_casts`: the weights the load rounded to the
serving dtype (a float32 checkpoint served in bfloat16), whose per-weight warnings this
module's import dropped — vLLM imports it in the worker's process before the model loads, so
it installs :func:`autospec.engine.vllm.weight_casts.install_cast_filter` there, and
:func:`autospec.engine.vllm.top_k_guard.install_top_k_guard` (a sampled request with
``top_k`` killed vLLM's CPU engine on a step where nothing was drafted) and
:func:`autospec.engine.vllm.cpu_expand.install_cpu_expand` (vLLM's CPU rejection sampler
verified sampled drafts under uninitialised temperatures, top-k and top-p).

Every file is read from safetensors after its SHA-256 is checked against the one autospec
computed when it exported the version; nothing is unpickled. Each method returns a small
dict (it crosses vLLM's msgpack boundary) and raises with a message that names what is wrong.

The drafter itself (``model_runner.drafter``) has no public accessor in vLLM 0.32: the
custom proposer is reached there, and ``tests/serve/test_vllm_inplace.py`` fails on a vLLM
that moves it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autospec.engine.vllm.cpu_expand import install_cpu_expand
from autospec.engine.vllm.top_k_guard import install_top_k_guard
from autospec.engine.vllm.weight_casts import install_cast_filter

#: vLLM's per-weight "Attempted to load weight …" warnings of rounding casts, counted instead
_CASTS = install_cast_filter()
#: vLLM's CPU top-k would kill the engine on a speculating step without drafts (see there)
install_top_k_guard()
#: vLLM's CPU expansion of temperature / top-k / top-p to the drafts wrote a copy (see there)
install_cpu_expand()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_checked(path: str, sha256: str) -> dict[str, Any]:
    """The tensors of the safetensors file ``path`` whose SHA-256 must be ``sha256``."""
    import safetensors.torch

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist")
    actual = file_sha256(file)
    if actual != sha256:
        raise ValueError(f"{file}: SHA-256 {actual[:12]}… is not the exported {sha256[:12]}…")
    return safetensors.torch.load_file(str(file), device="cpu")


def _shared_modules(draft: Any, target: Any) -> dict[str, Any]:
    """The draft's sub-modules that are the target's own objects, by the draft's names."""
    ours = {id(m) for m in target.modules()}
    return {name: m for name, m in draft.named_modules() if name and id(m) in ours}


def _drop_shared(tensors: dict[str, Any], shared: dict[str, Any]) -> list[str]:
    """Remove from ``tensors`` those of shared modules (equal to the target's: checked);
    return their names. :class:`ValueError` if one differs (the swap cannot be in place)."""
    import torch

    dropped = []
    for name in list(tensors):
        module_name = name.rsplit(".", 1)[0]
        for prefix in (module_name, f"model.{module_name}"):
            module = shared.get(prefix)
            if module is None:
                continue
            current = getattr(module, "weight", None)
            if current is None or current.numel() == 0 or \
                    not torch.equal(current.detach().cpu().to(tensors[name].dtype),
                                    tensors[name]):
                raise ValueError(f"{name} is shared with the target in the running engine "
                                 "and the new version's differs: it cannot be loaded in place")
            del tensors[name]
            dropped.append(name)
            break
    return dropped


class AutospecWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); see the module doc."""

    # what vLLM's worker class brings (declared only: the worker's own are used)
    model_runner: Any
    vllm_config: Any
    get_model: Callable[[], Any]
    get_draft_model: Callable[[], Any]

    def autospec_drafter(self) -> dict[str, Any]:
        """What drafts in this worker: the drafter's class, and whether it has a model."""
        drafter = getattr(self.model_runner, "drafter", None)
        draft = self.get_draft_model()
        return {"drafter": None if drafter is None else type(drafter).__name__,
                "draft_model": None if draft is None else type(draft).__name__}

    def autospec_reload_draft(self, weights: str, sha256: str) -> dict[str, Any]:
        """Load the draft model's weights from ``weights`` (checked against ``sha256``)."""
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        started = time.perf_counter()
        draft = self.get_draft_model()
        if draft is None:
            raise RuntimeError("this engine has no draft model to reload")
        tensors = read_checked(weights, sha256)
        target = self.get_model()
        skipped = _drop_shared(tensors, _shared_modules(draft, target))
        reload_weights(self.vllm_config, draft,
                       weights_iterator=iter(list(tensors.items())), weights_path=None,
                       is_checkpoint_format=True)
        return {"loaded": sorted(tensors), "shared_skipped": skipped,
                "seconds": time.perf_counter() - started}

    def autospec_cap_drafts(self) -> dict[str, Any]:
        """Cut every proposer's drafts where each request can end (synchronous scheduling;
        see :mod:`autospec.interop.vllm_request_end`)."""
        from autospec.interop.vllm_request_end import cap_drafts

        if self.vllm_config.scheduler_config.async_scheduling:
            return {"capped": False, "why": "asynchronous scheduling: vLLM verifies drafts "
                    "on the device and reports every step"}
        return {"capped": True, "new": cap_drafts(self.model_runner)}

    def autospec_weight_casts(self) -> dict[str, int]:
        """The weights cast to the serving dtype since the last call (``"float32->bfloat16"``
        → how many), their vLLM warnings dropped (:mod:`autospec.engine.vllm.weight_casts`)."""
        return _CASTS.take()

    def autospec_load_index(self, directory: str, sha256: dict[str, str],
                            version: str | None = None,
                            slot: str | None = None) -> dict[str, Any]:
        """Give autospec's custom proposer the index in ``directory`` (files checked): the
        one every request drafts from, or ``slot``'s (a segment's version: the requests
        that name it)."""
        started = time.perf_counter()
        drafter = _custom_proposer(self.model_runner, "load")
        attach = getattr(drafter, "attach", None)
        if attach is not None:  # each row's request: drafts stop where the request can end
            attach(self.model_runner)
        info = drafter.load_index(directory, sha256, version, slot)
        return {**info, "seconds": time.perf_counter() - started}

    def autospec_drop_index(self, slot: str) -> dict[str, Any]:
        """Forget ``slot``'s index (requests drafting from it keep it to their end)."""
        return dict(_custom_proposer(self.model_runner, "drop").drop_index(slot))


def _custom_proposer(runner: Any, what: str) -> Any:
    """autospec's custom proposer, ``runner``'s drafter; :class:`RuntimeError` if another."""
    drafter = getattr(runner, "drafter", None)
    if getattr(drafter, "load_index", None) is None:
        raise RuntimeError(f"the drafter {type(drafter).__name__} is not autospec's custom "
                           f"proposer: no index to {what}")
    return drafter

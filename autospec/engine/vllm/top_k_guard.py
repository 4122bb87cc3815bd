"""A guard for vLLM 0.32's CPU top-k, which kills the engine on a speculating step without drafts.

With a speculative config, vLLM's model runner verifies every decode step through its
rejection sampler, even a step where no request got a draft (an ngram or suffix proposer
that found no match): the target logits it samples the drafts from then have no rows. A
sampled request with ``top_k`` (and ``top_p`` 1, so vLLM masks top-k alone) sends those rows
to ``apply_top_k_only`` (``vllm/v1/sample/ops/topk_topp_sampler.py``), which on a CPU (no
Triton) calls ``k.max()`` on the empty per-row ``k`` and raises ``RuntimeError: max():
Expected reduction dim to be specified for input.numel() == 0``. The worker's exception is
the engine core's fatal error: every request in flight and every later one is answered 500
("EngineCore encountered an issue") until Ray Serve replaces the replica. Seen with
``autospec serve --engine vllm`` and ``{"top_k": 5}`` in a chat request (the native engine
serves it).

:func:`install_top_k_guard` wraps that function, in the process that samples (vLLM's
worker imports autospec's worker extension, :mod:`autospec.interop.vllm_worker`, which
installs it): logits of no rows are returned as they are (there is nothing to mask), any
other call is vLLM's own. It is installed once per process; where vLLM has no such function
(another version), nothing is installed and :func:`install_top_k_guard` says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"
_NAME = "apply_top_k_only"


def guarded(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``original`` (vLLM's ``apply_top_k_only(logits, k)``), but logits of no rows are
    returned unchanged instead of reaching its ``k.max()``."""

    @functools.wraps(original)
    def apply_top_k_only(logits: Any, k: Any) -> Any:
        if logits.shape[0] == 0:
            return logits
        return original(logits, k)

    apply_top_k_only.autospec_guard = True  # type: ignore[attr-defined]
    return apply_top_k_only


def install_top_k_guard() -> bool:
    """Put :func:`guarded` in place of vLLM's ``apply_top_k_only`` in this process (once);
    False where vLLM is not installed or has no such function."""
    import importlib

    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return False
    original = getattr(module, _NAME, None)
    if original is None:
        return False
    if not getattr(original, "autospec_guard", False):
        setattr(module, _NAME, guarded(original))
    return True

"""A correct per-draft expansion of the sampling settings for vLLM 0.32's CPU rejection sampler.

vLLM's rejection sampler verifies drafts under each request's temperature, top-k and top-p,
expanded from one value per request to one per draft token by ``expand_batch_to_tokens``
(``vllm/v1/sample/rejection_sampler.py``): a Triton kernel, which on a CPU without
Triton-CPU is vLLM's C++ override ``cpu_triton_utils._expand_kernel_impl``. That override
hands the C++ op ``output.to(torch.int64)``: for a float32 (temperature, top-p) or int32
(top-k) output that is a copy, the op writes the copy, and the tensor vLLM reads back is the
``new_empty`` it allocated — uninitialised memory. So every sampled request's drafts were
verified against logits divided by garbage temperatures and masked by garbage top-k / top-p,
and so were a greedy request's in a batch with any sampled one (vLLM expands the settings for
the whole batch then, and takes the greedy rows' argmax on those logits: a negative garbage
temperature made it the argmin), so greedy output was not the target's greedy output either
(with ``top_k``, ``logits.topk(garbage)`` raised "selected index k out of range" in the
worker and killed the engine: every request a 500 until the replica was replaced). Seen with
``autospec serve --engine vllm`` and ``{"top_k": 5}``; checked on the override itself
(float32 and int32 outputs left as they were, int64 written).

:func:`install_cpu_expand` puts :func:`expand_batch_to_tokens`, the same expansion in torch
(``repeat_interleave`` by each request's draft count, then the ``replace_from`` →
``replace_to`` substitution), in place of vLLM's, in the process that samples (vLLM's worker
imports autospec's worker extension, :mod:`autospec.interop.vllm_worker`, which installs
it). Only where vLLM has no Triton (its C++ overrides are in use); with Triton (a GPU),
vLLM's kernel runs as before.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_MODULE = "vllm.v1.sample.rejection_sampler"
_NAME = "expand_batch_to_tokens"
#: the parameters of vLLM 0.32's function, which :func:`expand_batch_to_tokens` takes alike
_PARAMETERS = ["x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to"]


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> Any:
    """vLLM's ``expand_batch_to_tokens``: ``x`` (one value per request) repeated for each of
    the request's tokens (``cu_num_tokens``: cumulative counts; ``num_tokens``: their sum),
    a value equal to ``replace_from`` given as ``replace_to``."""
    import torch

    assert cu_num_tokens.shape[0] == x.shape[0]
    counts = torch.diff(cu_num_tokens.to(torch.long),
                        prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(expanded == replace_from,
                       torch.tensor(replace_to, dtype=x.dtype, device=x.device), expanded)


def install_cpu_expand() -> bool:
    """Put :func:`expand_batch_to_tokens` in place of vLLM's rejection sampler's in this
    process, where vLLM runs without Triton; False where it is not installed (Triton, no
    vLLM, or a vLLM without that function, or whose function takes other parameters: a
    replacement vLLM's callers would call with arguments it does not take would raise in the
    worker and kill the engine, so vLLM's own stays, and a warning says so)."""
    import importlib
    import inspect

    try:
        from vllm.triton_utils import HAS_TRITON

        module = importlib.import_module(_MODULE)
    except ImportError:
        return False
    original = getattr(module, _NAME, None)
    if HAS_TRITON or original is None:
        return False
    if list(inspect.signature(original).parameters) != _PARAMETERS:
        log.warning("vLLM's %s.%s takes %s, not %s: its CPU expansion is left as it is",
                    _MODULE, _NAME, list(inspect.signature(original).parameters), _PARAMETERS)
        return False
    setattr(module, _NAME, expand_batch_to_tokens)
    return True

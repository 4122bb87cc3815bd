"""vLLM's CPU top-k on a speculating step where nothing was drafted
(:mod:`autospec.engine.vllm.top_k_guard`).

On vLLM's real sampling functions (no engine): the rejection sampler's top-k/top-p masking
(``apply_top_k_top_p``) of target logits of no rows, a sampled request with ``top_k``
alone, is what raised ``RuntimeError: max(): Expected reduction dim ...`` in the worker and
killed the engine (every later request a 500, ``autospec serve --engine vllm`` with
``{"top_k": 5}``). Importing autospec's worker extension, as vLLM's worker does, installs the
guard; rows are still masked by vLLM's own code. The same request through a real engine:
tests/serve/test_vllm_ray.py
(integration)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch
from vllm.v1.sample import rejection_sampler
from vllm.v1.sample.ops import topk_topp_sampler

VOCAB = 16


def _constrain(rows: int, top_k: int) -> torch.Tensor:
    """What vLLM's rejection sampler does last to ``rows`` target rows of a request sampled
    with ``top_k`` and top-p off (vLLM passes it as None): its ``apply_top_k_top_p``."""
    torch.manual_seed(0)
    logits = torch.randn(rows, VOCAB)
    return rejection_sampler.apply_top_k_top_p(logits, torch.full((rows,), top_k), None)


@pytest.mark.skipif(topk_topp_sampler.HAS_TRITON, reason="vLLM masks with Triton here")
def test_top_k_on_a_step_without_drafts_does_not_raise_in_the_worker():
    import autospec.interop.vllm_worker  # noqa: F401  (what vLLM's worker imports)

    assert _constrain(0, top_k=5).shape == (0, VOCAB)
    masked = _constrain(3, top_k=5)  # rows with drafts: masked by vLLM's own code
    assert masked.shape == (3, VOCAB)
    assert ((masked > -float("inf")).sum(dim=1) == 5).all()


def test_the_guard_is_installed_once_and_passes_rows_through():
    from autospec.engine.vllm.top_k_guard import guarded, install_top_k_guard

    assert install_top_k_guard() and install_top_k_guard()
    installed = topk_topp_sampler.apply_top_k_only
    assert installed.autospec_guard and not getattr(installed.__wrapped__, "autospec_guard",
                                                    False)
    calls = []
    wrapped = guarded(lambda logits, k: calls.append(k) or logits * 0)
    empty = torch.empty(0, VOCAB)
    assert wrapped(empty, torch.empty(0)) is empty and not calls
    assert torch.equal(wrapped(torch.ones(2, VOCAB), torch.tensor([1, 2])),
                       torch.zeros(2, VOCAB)) and len(calls) == 1

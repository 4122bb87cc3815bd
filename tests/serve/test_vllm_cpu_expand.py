"""vLLM's CPU rejection sampler expands each request's temperature, top-k and top-p to its
draft tokens (:mod:`autospec.engine.vllm.cpu_expand`). vLLM 0.32's C++ override of that
kernel wrote a copy of a float32 or int32 output and left the tensor vLLM reads
uninitialised: sampled drafts were verified under garbage temperatures, and ``top_k`` killed
the engine ("selected index k out of range"). On vLLM's real function with the CPU platform's
kernel overrides registered, as in vLLM's worker (no engine)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch
from vllm.triton_utils import HAS_TRITON
from vllm.v1.sample import rejection_sampler

from autospec.engine.vllm.cpu_expand import expand_batch_to_tokens

pytestmark = pytest.mark.skipif(HAS_TRITON, reason="vLLM's Triton kernel expands here")

CU = torch.tensor([2, 2, 5], dtype=torch.int32)  # 2 drafts, none, 3


@pytest.fixture(scope="module", autouse=True)
def cpu_overrides():  # type: ignore[no-untyped-def]
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("not vLLM's CPU platform")
    current_platform.register_triton_kernel_overrides()  # what the worker runs on


@pytest.mark.parametrize("values, dtype, replace, expected", [
    ([0.7, 0.9, 0.3], torch.float32, (-1, 1), [0.7, 0.7, 0.3, 0.3, 0.3]),  # temperatures
    ([5, 8, 0], torch.int32, (0, 0), [5, 5, 0, 0, 0]),  # top-k
    ([1.0, 0.5, 0.9], torch.float32, (0, 0), [1.0, 1.0, 0.9, 0.9, 0.9]),  # top-p
    ([0.0, 0.8, 0.0], torch.float32, (0, 1), [1.0, 1.0, 1.0, 1.0, 1.0]),  # greedy as 1
    ([3, 4, 6], torch.int64, (4, 9), [3, 3, 6, 6, 6]),
])
def test_the_worker_expands_each_requests_setting_to_its_drafts(values, dtype, replace,
                                                                 expected):
    import autospec.interop.vllm_worker  # noqa: F401  (what vLLM's worker imports)

    got = rejection_sampler.expand_batch_to_tokens(torch.tensor(values, dtype=dtype), CU, 5,
                                                   *replace)
    assert got.dtype == dtype
    assert got.tolist() == pytest.approx(expected)


def test_no_tokens_and_vllms_docstring_example():
    empty = expand_batch_to_tokens(torch.tensor([0.5]), torch.tensor([0]), 0)
    assert empty.shape == (0,) and empty.dtype == torch.float32
    x = torch.tensor([10, 20, 30])
    assert expand_batch_to_tokens(x, torch.tensor([2, 5, 6]), 6).tolist() == \
        [10, 10, 20, 20, 20, 30]


@pytest.mark.parametrize("top_k", [5, None])
def test_greedy_rows_batched_with_a_sampled_one_keep_their_target_argmax(top_k):
    """Through vLLM's own caller of the expansion (``apply_sampling_constraints``, whose
    calls an upgrade that changes them breaks here): greedy requests batched with a sampled
    one were verified against the argmax of logits divided by uninitialised temperatures and
    masked by uninitialised top-k (a negative temperature turns the argmax into the argmin),
    so their drafts were accepted or rejected against the wrong token. Greedy rows (vLLM's
    temperature 0, top-k the vocabulary) pass through untouched; the sampled row is scaled by
    its temperature and masked to its top-k (vLLM passes no top-k where no request has one)."""
    from types import SimpleNamespace

    import autospec.interop.vllm_worker  # noqa: F401  (what vLLM's worker imports)

    vocab, drafts, greedy = 32, 3, 16
    cu = torch.arange(1, greedy + 2, dtype=torch.int32) * drafts
    logits = torch.randn(len(cu) * drafts, vocab, generator=torch.Generator().manual_seed(0))
    metadata = SimpleNamespace(  # the fields apply_sampling_constraints reads
        all_greedy=False, top_p=None,
        temperature=torch.tensor([rejection_sampler.GREEDY_TEMPERATURE] * greedy + [0.7]),
        top_k=None if top_k is None else torch.tensor([vocab] * greedy + [top_k],
                                                      dtype=torch.int32))
    out = rejection_sampler.apply_sampling_constraints(logits.clone(), cu, metadata)
    rows = greedy * drafts
    assert torch.equal(out[:rows], logits[:rows])
    assert torch.equal(out[:rows].argmax(-1), logits[:rows].argmax(-1))
    kept = out[rows:] > -float("inf")
    assert (kept.sum(dim=1) == (top_k or vocab)).all()
    assert torch.allclose(out[rows:][kept], (logits[rows:] / 0.7)[kept])


def test_a_vllm_whose_function_takes_other_parameters_keeps_its_own(monkeypatch, caplog):
    """An upgrade that changes the function's parameters: vLLM's callers would call the
    replacement with arguments it does not take (a TypeError in the worker kills the engine),
    so nothing is installed and a warning names both; on vLLM 0.32 it is installed."""
    from autospec.engine.vllm.cpu_expand import install_cpu_expand

    assert install_cpu_expand()
    assert rejection_sampler.expand_batch_to_tokens is expand_batch_to_tokens

    def changed(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0, out=None):
        raise AssertionError("not called here")

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", changed)
    with caplog.at_level("WARNING", logger="autospec.engine.vllm.cpu_expand"):
        assert not install_cpu_expand()
    assert rejection_sampler.expand_batch_to_tokens is changed
    assert "'out'" in caplog.text and "left as it is" in caplog.text

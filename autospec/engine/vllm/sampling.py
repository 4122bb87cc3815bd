"""autospec's sampling settings as vLLM's: the one translation, used by serving
(:class:`~autospec.engine.vllm.engine.VllmEngine`) and synthesis
(:class:`~autospec.synth.backends.VllmSampler`). vLLM is imported when it is called."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autospec.engine.sampling import SamplingParams


def vllm_sampling(params: SamplingParams, *, n: int = 1, logprobs: int | None = None,
                  stop_token_ids: Iterable[int] = ()) -> Any:
    """vLLM's ``SamplingParams`` for ``params`` (every field autospec's engine applies: the
    temperature, top-k and top-p, seed, max tokens, stop strings, EOS, logit bias and the
    penalties), with ``n`` choices, ``logprobs`` alternatives per token (None: none) and
    ``stop_token_ids`` beyond the target's EOS."""
    from vllm import SamplingParams as VllmParams

    return VllmParams(
        n=n, temperature=params.temperature, top_p=params.top_p, top_k=max(0, params.top_k),
        seed=params.seed, max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
        stop_token_ids=sorted(stop_token_ids) or None, ignore_eos=params.ignore_eos,
        logprobs=logprobs, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logit_bias=dict(params.logit_bias) or None)


#: the key of vLLM's ``SamplingParams.extra_args`` naming the slot of autospec's proposer a
#: request drafts from (a segment's version: :mod:`autospec.interop.vllm_proposer`)
DRAFT_SLOT = "autospec_draft_slot"


def with_slot(sampling_params: Any, slot: str | None) -> Any:
    """vLLM's ``sampling_params`` naming ``slot`` in its ``extra_args``, and only that: a
    slot a client put there (``vllm_xargs``) is removed, so a request drafts from no index
    but the one its traffic row is named after (None: the deployment's)."""
    extra = {k: v for k, v in (sampling_params.extra_args or {}).items() if k != DRAFT_SLOT}
    if slot is not None:
        extra[DRAFT_SLOT] = slot
    sampling_params.extra_args = extra or None
    return sampling_params

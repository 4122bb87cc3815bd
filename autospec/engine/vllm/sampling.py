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

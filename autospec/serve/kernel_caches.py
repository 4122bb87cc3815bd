"""Bounds on the CPU matmul path's per-shape kernel caches, set in each replica's
environment.

A bfloat16 target on a CPU goes through PyTorch's ideep computation cache
(``LRU_CACHE_CAPACITY``) and oneDNN's primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``),
1024 entries each by default. Each new prompt length is a new matmul shape and a new entry,
so a replica's resident memory grows with the variety of traffic it has seen (+6.4 % over a
30-minute soak, docs/soak.md). Both at 64 held it to +0.9 % over 200 requests at the same
speed. float32 and GPU targets go through neither cache; the variables are then inert.

The variables must be in the process's environment before torch first runs a kernel, so
they travel in Ray's ``runtime_env.env_vars`` (a vLLM engine core, started by the replica,
inherits them). A value the operator sets — in ``ray_actor_options.runtime_env.env_vars``
or in the environment of the process that starts Ray — is kept.
"""

from __future__ import annotations

import os
from typing import Any

CACHE_VARS = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def with_kernel_cache_env(actor_options: dict[str, Any], entries: int | None,
                          environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``actor_options`` with both cache bounds at ``entries`` in its ``runtime_env``,
    except where the operator set one (None: the libraries' defaults, nothing added)."""
    if entries is None:
        return actor_options
    environ = os.environ if environ is None else environ
    runtime_env = dict(actor_options.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    for var in CACHE_VARS:
        if var not in env_vars and var not in environ:
            env_vars[var] = str(entries)
    return {**actor_options, "runtime_env": {**runtime_env, "env_vars": env_vars}}

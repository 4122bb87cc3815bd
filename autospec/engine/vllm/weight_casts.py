"""vLLM's per-weight dtype warnings at load, counted instead of printed.

vLLM's ``AutoWeightsLoader._load_param`` (``vllm/model_executor/models/utils.py``) warns
"Attempted to load weight … with dtype … into parameter with dtype …" for every checkpoint
tensor whose dtype is not its parameter's, short of an exact widening, and then casts it
(``param.data.copy_``). A float32 checkpoint served in bfloat16 — autospec's dequantized
GGUF cache, or any float32 model directory, with ``--dtype bfloat16`` or ``auto`` on a CPU
with bf16 — warns once for every weight loaded one to one (norms, ``o_proj``, ``down_proj``,
the embedding: 122 lines for SmolLM2-135M; the stacked ``qkv_proj`` / ``gate_up_proj``
shards load through another path, which casts silently). The casts are what bfloat16
serving means: bfloat16 keeps float32's exponent range, so float32 (or float16) values are
only rounded, never overflow. Other mismatches (into float16, or any non-float dtype) keep
vLLM's warning.

:class:`WeightCastFilter`, on that one logger, drops exactly those warnings and counts them
by dtype pair; :func:`install_cast_filter` puts it there once per process. It must be in
the process that loads the weights: vLLM's engine core (a spawned process) imports
autospec's worker extension (:mod:`autospec.interop.vllm_worker`) before it builds the
worker and loads the model, and that module installs it; an in-process engine installs it
itself. :func:`cast_summary` is the one line autospec logs instead (from the workers'
counts, in the process whose logging autospec configured: the engine core's is not).

The message is matched on vLLM 0.32's text: a vLLM that rewords it prints its warnings
again (tests/serve/test_vllm_weight_casts_tiny.py fails then), nothing is lost.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping

#: the logger and the message of vLLM's per-weight warning
VLLM_LOGGER = "vllm.model_executor.models.utils"
CAST_MESSAGE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"
#: (checkpoint dtype, parameter dtype) casts that only round: into bfloat16 (float32's range)
ROUNDING = frozenset({("torch.float32", "torch.bfloat16"), ("torch.float16", "torch.bfloat16")})


class WeightCastFilter(logging.Filter):
    """Drops vLLM's warnings of :data:`ROUNDING` casts and counts them
    (``"float32->bfloat16"`` → weights); lets every other record through."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != CAST_MESSAGE or not isinstance(args, tuple) or len(args) != 3:
            return True
        pair = (str(args[1]), str(args[2]))
        if pair not in ROUNDING:
            return True
        self.counts["->".join(p.removeprefix("torch.") for p in pair)] += 1
        return False

    def take(self) -> dict[str, int]:
        """The counts since the last take (each load reported once)."""
        counts, self.counts = dict(self.counts), Counter()
        return counts


def install_cast_filter() -> WeightCastFilter:
    """The process's :class:`WeightCastFilter` on vLLM's loader logger (added once)."""
    logger = logging.getLogger(VLLM_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, WeightCastFilter):
            return existing
    added = WeightCastFilter()
    logger.addFilter(added)
    return added


def cast_summary(reports: Iterable[Mapping[str, int]]) -> str | None:
    """One line for the workers' counts (each worker of a tensor-parallel engine casts its
    shard of the same weights: the largest count is the number of weights); None if none."""
    counts: dict[str, int] = {}
    for report in reports:
        for pair, n in report.items():
            counts[pair] = max(counts.get(pair, 0), int(n))
    if not counts:
        return None
    casts = ", ".join(f"{n} weights cast from {pair.replace('->', ' to ')}"
                      for pair, n in sorted(counts.items()))
    return f"{casts} at load (rounded to the serving dtype; vLLM's per-weight warnings dropped)"

"""``eagle3``: an EAGLE-3 style head on the target's hidden states, with a traffic suffix
index beside it. One module per job:

- :mod:`~autospec.speculators.eagle3.model` — the head (layers, KV cache, training-time
  test forward);
- :mod:`~autospec.speculators.eagle3.vocab` — the reduced draft vocabulary;
- :mod:`~autospec.speculators.eagle3.speculator` — the head + index hybrid at run time;
- :mod:`~autospec.speculators.eagle3.tree` — draft trees for greedy requests;
- :mod:`~autospec.speculators.eagle3.training` — the trainee, initialisations, the recipe;
- :mod:`~autospec.speculators.eagle3.export` — the speculators format for vLLM, and what
  vLLM cannot serve.

This package declares the kind (:data:`KIND`) and re-exports the names callers import.
"""

from __future__ import annotations

from autospec.speculators.config import Eagle3Config
from autospec.speculators.eagle3.export import export_eagle3, vllm_refusal
from autospec.speculators.eagle3.model import Eagle3Head, HeadKVCache
from autospec.speculators.eagle3.speculator import SUFFIX_PREFIX, Eagle3Speculator, index_config
from autospec.speculators.eagle3.training import Eagle3Recipe, Eagle3Trainee
from autospec.speculators.eagle3.vocab import build_draft_vocab
from autospec.speculators.kind import GradientTraining, Kind, VllmSupport
from autospec.speculators.speculators_format import head_shapes

__all__ = ["KIND", "SUFFIX_PREFIX", "Eagle3Head", "Eagle3Recipe", "Eagle3Speculator",
           "Eagle3Trainee", "HeadKVCache", "build_draft_vocab", "index_config"]

#: the variants ``autospec bench train`` measures (autospec/bench/train_variants.py)
BENCH_VARIANTS = ("scratch", "synthetic", "base", "base+finetune")

def stored_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """The head's tensors, its draft vocabulary and its suffix index's arrays."""
    index = {f"{SUFFIX_PREFIX}{n}": (config.suffix_tokens,) for n in ("tokens", "suffix_array")}
    return {**head_shapes(config), "d2t": (config.draft_vocab_size,),
            **(index if config.suffix_tokens else {})}


KIND = Kind(name="eagle3", config=Eagle3Config, speculator=Eagle3Speculator, has_layers=True,
            training=GradientTraining(Eagle3Recipe(), lr=3e-3), shapes=stored_shapes,
            # vLLM runs a head alone, in chains: a candidate for it drafts no trees, no index
            vllm=VllmSupport(method="eagle3", export=export_eagle3, refusal=vllm_refusal,
                             overrides={"tree_nodes": 0, "suffix_threshold": None}),
            bench_variants=BENCH_VARIANTS)

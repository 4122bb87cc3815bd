"""``draft``: an independent small causal LM sharing the target's vocabulary.

The speculator is :mod:`~autospec.speculators.draft.model`; it trains by distillation
(:mod:`~autospec.speculators.draft.training`) and vLLM serves it with its ``draft_model``
method from a plain ``LlamaForCausalLM`` directory (:func:`export_draft`).
"""

from __future__ import annotations

from pathlib import Path

from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import DraftConfig
from autospec.speculators.draft.model import DraftSpeculator, llama_config, stored_shapes
from autospec.speculators.draft.training import DraftRecipe, DraftTrainee
from autospec.speculators.files import WEIGHTS_FILE, portable, save_tensors, tensor_sha256
from autospec.speculators.kind import Exported, GradientTraining, Kind, VllmSupport

__all__ = ["KIND", "DraftRecipe", "DraftSpeculator", "DraftTrainee", "export_draft",
           "llama_config"]


def export_draft(spec: SavableSpeculator, target: Target, out: Path, k: int) -> Exported:
    """A ``LlamaForCausalLM`` directory (the shared target embedding and LM head written
    out) with the target's tokenizer, for vLLM's ``draft_model`` method."""
    assert isinstance(spec, DraftSpeculator)
    hf = llama_config(spec.config)
    hf.architectures = ["LlamaForCausalLM"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(hf, key, getattr(target.model.config, key, None))
    state = dict(spec.model.state_dict())  # the shared ones included
    hf.save_pretrained(out)
    save_tensors(state, out / WEIGHTS_FILE)
    files = ["config.json", WEIGHTS_FILE]
    if target.tokenizer is not None:
        before = {p.name for p in out.iterdir()}
        target.tokenizer.save_pretrained(out)
        files += sorted({p.name for p in out.iterdir() if p.is_file()} - before)
    sums = {n: {"sha256": tensor_sha256(portable(t)), "from": n} for n, t in state.items()}
    return Exported(speculative_config={"method": "draft_model", "model": str(out),
                                        "num_speculative_tokens": k},
                    files=sorted(set(files)), tensors=sums)


KIND = Kind(name="draft", config=DraftConfig, speculator=DraftSpeculator,
            has_layers=True, training=GradientTraining(DraftRecipe(), lr=3e-4),
            vllm=VllmSupport(method="draft_model", export=export_draft), shapes=stored_shapes)

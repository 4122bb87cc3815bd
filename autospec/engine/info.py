"""What a speculator must know of its target, without loading it: :class:`TargetInfo`.

Torch-free on purpose (so are the speculator configs that take it, and anything that only
reads configs); :mod:`autospec.engine.target` fills it in when it loads a model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetInfo:
    """What a speculator must match to serve a target."""

    target_id: str  # a name, or the path it was loaded from
    revision: str  # short hash of the config and weights' identity
    vocab_size: int  # rows of the LM head (token ids the target can emit)
    hidden_size: int
    num_layers: int
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int

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
    revision: str  # short hash of the config and weights' identity (not of the dtype)
    vocab_size: int  # rows of the LM head (token ids the target can emit)
    hidden_size: int
    num_layers: int
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    legacy_revision: str | None = None  # the older revision of this load, dtype included

    def accepts_revision(self, revision: str | None) -> bool:
        """Whether a speculator built for ``revision`` fits this target."""
        return revision is not None and revision in (self.revision, self.legacy_revision)

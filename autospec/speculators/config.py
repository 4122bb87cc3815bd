"""Typed, strict configs: the base every kind's config subclasses, and the built-in kinds'.

Every config is a pydantic model (a :class:`KindConfig`) with ``extra="forbid"`` (a typo
is an error naming the field), a ``kind`` literal, and the identity of the target it was
built for (``target_id``, ``target_revision``), which loading checks against the live
target. A config dict is parsed by its ``kind`` tag through the registry
(:func:`autospec.speculators.registry.parse_config`), which knows every kind's model.

A config holds hyperparameters only; weights live in ``model.safetensors``. Defaults
that depend on the target (hidden size, vocabulary, feature layers) come from
``for_target`` class methods, which take a :class:`~autospec.engine.info.TargetInfo`
and the target's own architecture hints. This module knows nothing of torch: it imports
only pydantic and :mod:`autospec.engine.info` (``tests/test_imports.py`` checks it).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autospec.engine.info import TargetInfo

#: default size of the EAGLE-3 reduced draft vocabulary (capped by the target's vocabulary)
DEFAULT_DRAFT_VOCAB_SIZE = 8192


class KindConfig(BaseModel):
    """What every kind's config is: strict, frozen, with the target's identity. A kind's
    config subclasses it and adds ``kind: Literal["<name>"]`` and its hyperparameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="speculator kind tag")
    target_id: str = Field(description="id of the target this speculator serves (TargetInfo)")
    target_revision: str = Field(description="revision of that target (TargetInfo.revision)")

    @classmethod
    def for_target(cls, info: TargetInfo, **overrides: Any) -> Self:
        """The kind's defaults for the target ``info``, then ``overrides``."""
        return cls(target_id=info.target_id, target_revision=info.revision, **overrides)


class NgramConfig(KindConfig):
    """Prompt lookup: propose what followed the latest earlier match of the last n tokens."""

    kind: Literal["ngram"] = Field(default="ngram", description="speculator kind tag")
    max_ngram: int = Field(default=3, ge=1, le=64, description="longest suffix to match")
    min_ngram: int = Field(default=1, ge=1, le=64, description="shortest suffix to match")

    @model_validator(mode="after")
    def _check(self) -> NgramConfig:
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})"
            )
        return self


class _Transformer(KindConfig):
    """Fields shared by the kinds that own transformer layers."""

    hidden_size: int = Field(ge=8, description="width of the speculator's hidden states")
    intermediate_size: int = Field(ge=8, description="width of the MLP's inner projection")
    num_heads: int = Field(ge=1, description="attention heads")
    num_kv_heads: int = Field(ge=1, description="key/value heads (grouped-query attention)")
    max_position_embeddings: int = Field(ge=16, description="longest sequence (RoPE positions)")
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base frequency")
    rms_norm_eps: float = Field(default=1e-5, gt=0, description="epsilon of the RMS norms")

    @model_validator(mode="after")
    def _check_heads(self) -> _Transformer:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads})"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class DraftConfig(_Transformer):
    """An independent small Llama sharing the target's vocabulary (and tokenizer)."""

    kind: Literal["draft"] = Field(default="draft", description="speculator kind tag")
    vocab_size: int = Field(ge=2, description="vocabulary size; must equal the target's")
    num_layers: int = Field(default=2, ge=1, le=32, description="decoder layers of the draft")
    share_target_embeddings: bool = Field(
        default=True,
        description="take the input embedding and LM head from the target at build/load time "
        "(frozen, not stored in the checkpoint; needs hidden_size == target's)",
    )

    @classmethod
    def for_target(cls, info: TargetInfo, **overrides: Any) -> DraftConfig:
        values: dict[str, Any] = {
            "target_id": info.target_id,
            "target_revision": info.revision,
            "vocab_size": info.vocab_size,
            "hidden_size": info.hidden_size,
            "intermediate_size": info.hidden_size * 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "max_position_embeddings": info.max_position_embeddings,
        }
        values.update(overrides)
        return cls(**values)


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high target layers, in the feature layer convention.

    Index 0 is the embedding output, ``i`` the output of decoder layer ``i`` (``N``, the
    last one's, before the final norm: :mod:`autospec.engine.feature_layers`). As in
    EAGLE-3 (and vLLM's default): ``(2, N // 2, N - 3)`` from 7 layers; shallower targets
    get ``(1, N // 2, N - 1)``, and 3 layers ``(0, 1, 2)``: from 3 layers up, three
    strictly increasing ids below ``N``, which vLLM reads as autospec does (so does any
    strictly increasing triple in ``[0, N]``: :mod:`autospec.speculators.eagle3.export`).
    A 1- or 2-layer target gets ``(1, 1, 1)``, which the native engine serves and vLLM
    refuses (a 2-layer target's ``(0, 1, 2)`` is one to ask for explicitly).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers >= 4:
        return (1, num_layers // 2, num_layers - 1)
    return (0, 1, 2) if num_layers == 3 else (1, 1, 1)


class Eagle3Config(_Transformer):
    """EAGLE-3 head: three target layers' features -> one decoder layer -> reduced vocab."""

    kind: Literal["eagle3"] = Field(default="eagle3", description="speculator kind tag")
    target_vocab_size: int = Field(ge=2, description="the target's vocabulary size")
    feature_layers: tuple[int, int, int] = Field(
        description="target hidden-state indices (0 = embeddings, i = output of layer i, "
        "the last layer's before the final norm, as vLLM reads it) of the low, middle and "
        "high features"
    )
    draft_vocab_size: int = Field(
        ge=2, description="size of the reduced draft vocabulary (LM head rows)"
    )
    ttt_steps: int = Field(
        default=3, ge=1, le=16, description="training-time-test unroll depth used by training"
    )
    suffix_threshold: float | None = Field(
        default=0.7, ge=0.0, le=1.0, description="propose the traffic suffix index's "
        "continuation instead of the head's when its expected accepted length is at least "
        "this fraction of k (the index is built from the training window); null: the head "
        "alone, no index")
    suffix_tokens: int = Field(
        default=0, ge=0, description="tokens in the suffix index stored with the head "
        "(0: none); set by training")
    suffix_carried_tokens: int = Field(
        default=0, ge=0, description="the first this many tokens of the suffix index are "
        "the target's own answers (autospec synth/pretrain) and are carried into every head "
        "warm-started from this one; the rest is the training window's, rebuilt each time; "
        "set by training")
    tree_nodes: int = Field(
        default=16, ge=0, le=64, description="greedy requests: draft a tree of this many "
        "candidates (the most likely continuations by the head's cumulative probability, "
        "as EAGLE-2), verified in one target forward; 0: a chain of k drafts")
    tree_min_prob: float = Field(
        default=0.05, ge=0.0, le=1.0, description="tree drafting: leave out candidates "
        "whose cumulative probability (the head's, or the suffix index's for its branch) is "
        "below this — about where an extra verified token stops paying on a CPU, where each "
        "costs ~2.5 % of a step; 0 on GPUs, where a verify of dozens costs one step (the "
        "likeliest candidate always stays)")
    tree_width: int = Field(
        default=4, ge=1, le=8, description="tree drafting: candidates expanded per depth, "
        "and children kept per expanded candidate")
    norm_before_residual: bool = Field(
        default=False, description="the decoder layer's residual stream starts from "
        "hidden_norm(hidden) instead of hidden (speculators' flag of the same name; heads "
        "autospec trains use false, imported heads keep theirs)")

    @model_validator(mode="after")
    def _check_vocab(self) -> Eagle3Config:
        if self.draft_vocab_size > self.target_vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) must be <= target_vocab_size "
                f"({self.target_vocab_size})"
            )
        if any(layer < 0 for layer in self.feature_layers):
            raise ValueError(f"feature_layers must be >= 0, got {self.feature_layers}")
        return self

    @classmethod
    def for_target(cls, info: TargetInfo, **overrides: Any) -> Eagle3Config:
        values: dict[str, Any] = {
            "target_id": info.target_id,
            "target_revision": info.revision,
            "target_vocab_size": info.vocab_size,
            "hidden_size": info.hidden_size,
            "intermediate_size": info.hidden_size * 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "max_position_embeddings": info.max_position_embeddings,
            "feature_layers": default_feature_layers(info.num_layers),
            "draft_vocab_size": min(DEFAULT_DRAFT_VOCAB_SIZE, info.vocab_size),
        }
        values.update(overrides)
        return cls(**values)


class SuffixConfig(KindConfig):
    """Most frequent continuation in past traffic (a suffix index) or in the request itself."""

    kind: Literal["suffix"] = Field(default="suffix", description="speculator kind tag")
    corpus_tokens: int = Field(
        default=0, ge=0, description="tokens in the indexed corpus (separators included); "
        "set by the builder, checked against the stored arrays")
    max_match: int = Field(default=32, ge=1, le=1024,
                           description="longest suffix of the sequence matched in the corpus")
    max_local_ngram: int = Field(default=4, ge=1, le=64,
                                 description="longest n-gram matched within the request")
    min_token_prob: float = Field(
        default=0.1, ge=0.0, le=1.0,
        description="stop proposing at a token whose estimated probability is below this")
    min_path_prob: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="stop proposing where the product of the estimated probabilities so far "
        "falls below this (SuffixDecoding's rule; 0: off, only min_token_prob applies)")
    max_spec_factor: float | None = Field(
        default=None, gt=0.0, le=64.0,
        description="propose at most this many tokens per token of the match the proposal "
        "continues (SuffixDecoding's max_spec_factor: short matches, short drafts); None: up "
        "to k")
    prompt_tail: int = Field(default=4, ge=0, le=256,
                             description="prompt tokens indexed before each output")

    @classmethod
    def for_target(cls, info: TargetInfo, **overrides: Any) -> Self:
        """A new version's settings: SuffixDecoding's stopping rules on
        (:data:`NEW_SUFFIX_RULES`), then ``overrides``. The fields' own defaults keep them off,
        so a version written before them drafts as it was evaluated."""
        return super().for_target(info, **{**NEW_SUFFIX_RULES, **overrides})


#: the stopping rules new suffix versions draft with (SuffixDecoding's defaults): the same τ
#: within 1 %, about a quarter fewer draft tokens for the verifier (docs/vllm.md)
NEW_SUFFIX_RULES: dict[str, Any] = {"min_path_prob": 0.1, "max_spec_factor": 1.0}


"""Teacher-forced target passes over training sequences, cached in half precision.

:func:`extract_features` runs the frozen target over every sequence (prompt + output),
in right-padded batches of similar length, and keeps per position:

- ``features``: the concatenated hidden states of ``feature_layers`` (what the
  ``eagle3`` head reads, read as the engine reads them:
  :func:`~autospec.engine.feature_layers.forward_with_features`; ``[N, len(layers) * H]``,
  stored as ``dtype``, bfloat16 by default) — only when layers are asked for;
- ``top_ids`` / ``top_logprobs``: the target's ``top_k`` most likely next tokens and
  their log-probabilities (``[N, top_k]``, int32 / float16); ``top_ids[:, 0]`` is the
  target's greedy choice. Distillation losses use them as the target's distribution.
  They are computed only where a position predicts an output token (from
  ``prompt_len - 1`` on; the LM head over the vocabulary is skipped for the rest of the
  prompt) and hold ``0`` / ``-1e4`` before that: no loss reads them.

The sequences are stored flat (``ids [N]``, ``offsets [S + 1]``, ``prompt_lens [S]``),
so a :class:`~autospec.speculators.training.FeatureCache` (defined beside the recipes that
read it, re-exported here) is a handful of tensors: it lives in memory for the epochs
of one run and is written with safetensors (never pickle) when Ray workers need it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from autospec.engine.feature_layers import forward_with_features
from autospec.engine.target import Target
from autospec.speculators.training import FeatureCache, TrainSequence

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 20
#: how a cached file's features read layer N (the target's depth): before the final norm, as
#: :mod:`autospec.engine.feature_layers` does; files without it read it after the norm
LAST_LAYER = "pre-norm"


@torch.inference_mode()
def extract_features(
    target: Target,
    sequences: list[TrainSequence],
    *,
    feature_layers: tuple[int, ...] = (),
    top_k: int = DEFAULT_TOP_K,
    dtype: torch.dtype = torch.bfloat16,
    batch_tokens: int = 4096,
    progress: Callable[[int], None] | None = None,
) -> FeatureCache:
    """Run the frozen target over ``sequences``; ``progress(n)`` after each batch of n."""
    if not sequences:
        raise ValueError("no sequences to extract features from")
    n_seq = len(sequences)
    lengths = torch.tensor([len(s.ids) for s in sequences])
    offsets = torch.zeros(n_seq + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    total = int(offsets[-1])
    ids = torch.tensor([t for s in sequences for t in s.ids], dtype=torch.long)
    # positions before the output keep no teacher (0 / -1e4): no loss reads them
    top_ids = torch.zeros(total, top_k, dtype=torch.int32)
    top_lp = torch.full((total, top_k), -1e4, dtype=torch.float16)
    width = len(feature_layers) * target.info.hidden_size
    features = torch.empty(total, width, dtype=dtype) if feature_layers else None
    prompt_lens = torch.tensor([s.prompt_len for s in sequences])
    for batch in _length_batches(lengths, batch_tokens):
        longest = int(lengths[batch].max())
        first = max(0, int(prompt_lens[batch].min()) - 1)  # first position predicting output
        out, feats = _forward_batch(target, [sequences[i].ids for i in batch], feature_layers,
                                    logits_to_keep=longest - first)
        for row, i in enumerate(batch):
            start, n = int(offsets[i]), int(lengths[i])
            lo = max(first, int(prompt_lens[i]) - 1)
            logp = torch.log_softmax(out.logits[row, lo - first : n - first].float(), dim=-1)
            values, indices = logp.topk(top_k, dim=-1)
            top_ids[start + lo : start + n], top_lp[start + lo : start + n] = indices.int(), \
                values.half()
            if features is not None:
                features[start : start + n] = feats[row, :n].to(dtype)
        if progress is not None:
            progress(len(batch))
    return FeatureCache(ids=ids, offsets=offsets,
                        prompt_lens=prompt_lens, top_ids=top_ids, top_logprobs=top_lp,
                        features=features)


def _forward_batch(target: Target, seqs: list[list[int]], layers: tuple[int, ...],
                   logits_to_keep: int = 0) -> tuple[Any, torch.Tensor | None]:
    """One padded target forward (right padding, attention mask): its output (logits of the
    last ``logits_to_keep`` positions, 0: all) and the features of ``layers``
    (``[batch, width, len(layers) * H]``, as the engine reads them)."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return forward_with_features(target.model, layers, input_ids=ids.to(target.device),
                                 attention_mask=mask.to(target.device), use_cache=False,
                                 logits_to_keep=logits_to_keep)


def _length_batches(lengths: torch.Tensor, batch_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length, each group padded to <= ``batch_tokens``."""
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = int(lengths[current[0]]) if current else int(lengths[i])
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def cached_extract(cache_dir: Path | None, target: Target, sequences: list[TrainSequence], *,
                   feature_layers: tuple[int, ...] = (), top_k: int = DEFAULT_TOP_K,
                   progress: Callable[[int], None] | None = None) -> FeatureCache:
    """:func:`extract_features`, reusing a file in ``cache_dir`` made for the same inputs.

    The key is the target (id, revision, dtype), ``top_k`` and every token of every
    sequence; a cached file with features of the same layers also serves a request for
    no features (draft after eagle3 on one window). A file whose layers include the
    target's depth N and that does not say it read layer N before the final norm (written
    before autospec did, :data:`LAST_LAYER`) is computed again. ``cache_dir=None``: no reuse.
    """
    if cache_dir is None:
        return extract_features(target, sequences, feature_layers=feature_layers, top_k=top_k,
                                progress=progress)
    digest = hashlib.sha256(json.dumps(
        [target.info.target_id, target.info.revision, str(target.dtype), top_k,
         [(s.prompt_len, s.ids) for s in sequences]]).encode()).hexdigest()[:24]
    path = Path(cache_dir) / f"features-{digest}.safetensors"
    wanted = ",".join(map(str, feature_layers))
    if path.exists():
        with safetensors.safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        same = meta.get("layers", "") == wanted and (
            target.info.num_layers not in feature_layers or meta.get("last_layer") == LAST_LAYER)
        if not feature_layers or same:
            log.info("reusing target features %s", path.name)
            cache = FeatureCache.load(path)
            if progress is not None:
                progress(len(sequences))
            return cache if feature_layers else FeatureCache(
                ids=cache.ids, offsets=cache.offsets, prompt_lens=cache.prompt_lens,
                top_ids=cache.top_ids, top_logprobs=cache.top_logprobs)
    cache = extract_features(target, sequences, feature_layers=feature_layers, top_k=top_k,
                             progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.partial")  # one a writer
    cache.save(tmp, metadata={"layers": wanted, "last_layer": LAST_LAYER})
    tmp.replace(path)  # two writers of one key write the same features: the last one stays
    return cache

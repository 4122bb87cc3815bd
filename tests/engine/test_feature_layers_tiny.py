"""Feature layer id N (the target's depth) is the last decoder layer's output *before* the
final norm, as vLLM 0.32 collects it, in serving (:meth:`Target.forward`) and in training
(:func:`extract_features`) alike; Hugging Face's ``hidden_states[N]`` is after the norm, and
was read until it was fixed. Ids below N are Hugging Face's ``hidden_states[i]``. The
reference is the same model with its final norm taken out, whose ``hidden_states[N]`` is the
pre-norm output. Tiny random-init Llama targets."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

from autospec.engine.target import Target
from autospec.train.data import TrainSequence
from autospec.train.features import FeatureCache, cached_extract, extract_features
from tests.tiny import tiny_target

DEPTH = 2


@pytest.fixture(scope="module")
def target() -> Target:
    return tiny_target(num_layers=DEPTH, seed=3)


def _reference(target: Target, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """``[n, len(layers) * H]``: the model without its final norm, Hugging Face's tuple."""
    bare = copy.deepcopy(target.model)
    bare.model.norm = nn.Identity()
    with torch.inference_mode():
        states = bare(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in layers], dim=-1)


def _post_norm(target: Target, ids: list[int]) -> torch.Tensor:
    """Hugging Face's ``hidden_states[N]`` (``[n, H]``): after the final norm."""
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[DEPTH][0]


def test_id_n_is_read_before_the_final_norm_when_serving_tiny_random_init(target) -> None:
    ids = [1, 7, 3, 9, 4, 12, 5]
    hidden = target.info.hidden_size
    layers = (0, 1, DEPTH)
    whole = target.forward(torch.tensor(ids), target.new_cache(), feature_layers=layers)
    assert whole.features is not None and whole.features.shape == (len(ids), 3 * hidden)
    torch.testing.assert_close(whole.features, _reference(target, ids, layers))
    last = whole.features[:, 2 * hidden :]
    assert not torch.allclose(last, _post_norm(target, ids), atol=1e-3)
    torch.testing.assert_close(target.model.model.norm(last), _post_norm(target, ids))
    # decoding: after a cached prefix, in the head's order, an id repeated
    hooks = dict(target.model.model.layers[-1]._forward_hooks)  # Hugging Face's own
    cache = target.new_cache()
    target.forward(torch.tensor(ids[:4]), cache)
    step = target.forward(torch.tensor(ids[4:]), cache, feature_layers=(DEPTH, 1, DEPTH))
    torch.testing.assert_close(step.features,
                               _reference(target, ids, (DEPTH, 1, DEPTH))[4:], atol=1e-5,
                               rtol=1e-5)
    assert dict(target.model.model.layers[-1]._forward_hooks) == hooks  # ours is gone


def test_id_n_is_read_before_the_final_norm_in_training_features_tiny_random_init(
        target) -> None:
    seqs = [TrainSequence(ids=[1, 7, 3, 9, 4, 12, 5], prompt_len=3),
            TrainSequence(ids=[2, 8, 6, 11], prompt_len=2)]  # padded in one batch
    layers = (0, 1, DEPTH)
    cache = extract_features(target, seqs, feature_layers=layers, dtype=torch.float32)
    assert cache.features is not None
    hidden = target.info.hidden_size
    for i, seq in enumerate(seqs):
        rows = cache.features[int(cache.offsets[i]) : int(cache.offsets[i + 1])]
        torch.testing.assert_close(rows, _reference(target, seq.ids, layers), atol=1e-5,
                                   rtol=1e-5)
        assert not torch.allclose(rows[:, 2 * hidden :], _post_norm(target, seq.ids), atol=1e-3)


@pytest.mark.parametrize(("layers", "recomputed"), [((0, 1, DEPTH), True), ((0, 1, 1), False)])
def test_a_cached_file_from_before_is_recomputed_only_with_id_n_tiny_random_init(
        target, tmp_path: Path, layers, recomputed) -> None:
    """A file written before id N was read before the norm (its metadata says the layers
    only) holds post-norm features for id N: it is not reused; other layers' are the same."""
    seqs = [TrainSequence(ids=[1, 7, 3, 9, 4, 12, 5], prompt_len=3)]
    fresh = cached_extract(tmp_path, target, seqs, feature_layers=layers)
    (path,) = tmp_path.glob("features-*.safetensors")
    assert fresh.features is not None
    old = FeatureCache(ids=fresh.ids, offsets=fresh.offsets, prompt_lens=fresh.prompt_lens,
                       top_ids=fresh.top_ids, top_logprobs=fresh.top_logprobs,
                       features=torch.zeros_like(fresh.features))  # marks the old file
    old.save(path, metadata={"layers": ",".join(map(str, layers))})
    again = cached_extract(tmp_path, target, seqs, feature_layers=layers)
    assert again.features is not None
    assert torch.equal(again.features, fresh.features if recomputed else old.features)
    have = safetensors.safe_open(str(path), "pt").metadata()
    assert ("last_layer" in have) is recomputed  # rewritten only when recomputed


def test_ids_outside_the_depth_are_refused_tiny_random_init(target) -> None:
    with pytest.raises(ValueError, match=r"feature layers \[0, 3\] outside \[0, 2\]"):
        target.forward(torch.tensor([1, 2]), target.new_cache(), feature_layers=(0, DEPTH + 1))

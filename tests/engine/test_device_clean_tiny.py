"""Every tensor the decode loop makes sits on the device of the tensors it meets.

Runs without a GPU: the tiny random-init target is put on a simulated accelerator
(``tests/simdevice.py``) that tracks where each tensor lives and raises where CUDA would
(a host tensor meeting an accelerator tensor, a host generator sampling accelerator
probabilities). Each speculator kind decodes greedy and sampled requests inside it; the
output must equal the same decode outside the simulation.
"""

from __future__ import annotations

import pytest
import torch

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.reference import OracleSpeculator, RandomSpeculator
from autospec.engine.sampling import SamplingParams
from autospec.speculators.config import SuffixConfig
from autospec.speculators.registry import new_speculator
from autospec.speculators.suffix import suffix_from_documents
from tests.simdevice import ACCEL, DeviceMismatch, SimulatedAccelerator, place
from tests.tiny import tiny_target

PROMPT = [3, 9, 4, 3, 9, 4, 3, 9, 1, 2, 3, 9]
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=30, seed=5, ignore_eos=True)
KINDS = ["oracle", "random", "ngram", "suffix", "draft", "eagle3-chain", "eagle3-tree",
         "eagle3-suffix"]


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=64, seed=0)


@pytest.fixture(scope="module")
def plain(target):
    return SpeculativeEngine(target).generate(PROMPT, GREEDY).token_ids


def _speculator(kind: str, target, plain: list[int]):
    docs = [(PROMPT, plain)]
    if kind == "oracle":
        return OracleSpeculator(plain)
    if kind == "random":
        return RandomSpeculator(target.info.vocab_size, seed=1)
    if kind == "suffix":
        return suffix_from_documents(SuffixConfig.for_target(target.info), docs, target)
    if kind == "eagle3-chain":
        return new_speculator("eagle3", target, tree_nodes=0)
    if kind == "eagle3-tree":
        return new_speculator("eagle3", target, tree_nodes=8)
    if kind == "eagle3-suffix":  # proposes from its index where confident, else the head
        spec = new_speculator("eagle3", target, tree_nodes=0, suffix_threshold=0.1)
        spec.attach_suffix(suffix_from_documents(SuffixConfig.for_target(target.info), docs,
                                                 target))
        return spec
    return new_speculator(kind, target)


def _decode(target, kind: str, plain: list[int], params: SamplingParams) -> list[int]:
    spec = _speculator(kind, target, plain)
    return SpeculativeEngine(target, spec, num_speculative_tokens=4).generate(
        PROMPT, params).token_ids


@pytest.mark.parametrize("kind", KINDS)
def test_decode_tiny_random_init_is_device_clean_for_each_kind(target, plain, kind):
    expected_sampled = _decode(target, kind, plain, SAMPLED)
    place(target.model)
    try:
        with SimulatedAccelerator() as sim:
            assert target.device == ACCEL
            greedy = _decode(target, kind, plain, GREEDY)
            sampled = _decode(target, kind, plain, SAMPLED)
    finally:
        place(target.model, accel=False)
    assert greedy == plain  # lossless, as on the host
    assert sampled == expected_sampled  # same seed, same stream
    assert sim.checked_ops > 1000  # the checks ran on the target's ops


def test_simulated_accelerator_tiny_catches_what_cuda_refuses(target):
    """The harness itself: the faults it must catch, and what CUDA allows."""
    module = torch.nn.Module()
    module.register_buffer("w", torch.ones(3))
    w = place(module).w
    with SimulatedAccelerator():
        assert w.device == ACCEL and torch.ones(3).device != ACCEL
        with pytest.raises(DeviceMismatch):
            _ = torch.arange(3) + w  # made on the host, meets the accelerator
        with pytest.raises(DeviceMismatch):
            torch.multinomial(w, 1, generator=torch.Generator())
        assert (torch.arange(3, device=w.device) + w).device == ACCEL
        assert torch.multinomial(w, 1, generator=torch.Generator(device=w.device)).device == ACCEL
        assert (w + torch.tensor(2.0)).device == ACCEL  # a host scalar may meet it
        assert w[torch.tensor([0, 2])].device == ACCEL  # host indices may index it
        assert w.cpu().device != ACCEL and w.to(torch.device("cpu")).device != ACCEL


@pytest.mark.parametrize("kind", ["eagle3", "draft"])
def test_training_step_tiny_random_init_is_device_clean(target, kind):
    """A trainee on the accelerator gets its batches there (the feature cache is on the host)."""
    from autospec.train.data import TrainSequence
    from autospec.train.features import extract_features
    from autospec.train.kinds import TraineeOptions
    from autospec.train.kinds import recipe as recipe_of

    seqs = [TrainSequence(ids=[*PROMPT, 5 + i, 6, 7, 8, 9], prompt_len=len(PROMPT))
            for i in range(4)]
    spec = new_speculator(kind, target)
    recipe = recipe_of(kind)
    recipe.prepare(spec, seqs, target, None)
    cache = extract_features(target, seqs, feature_layers=spec.feature_layers)
    trainee = recipe.trainee(spec, TraineeOptions(ttt_steps=2, eos_ids=(63,)))
    place(trainee)
    try:
        with SimulatedAccelerator() as sim:
            loss, _, _ = trainee(**trainee.make_batch(cache, [0, 1, 2, 3]))
    finally:
        place(trainee, accel=False)
    assert torch.isfinite(loss) and sim.checked_ops > 10

"""A warm start begins from the incumbent's stored float32 weights exactly, also on a
bfloat16 target, where a version loaded to draft holds them rounded to bfloat16 (tiny
random-init targets)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autospec import store
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator
from autospec.train.data import TrainSequence
from autospec.train.kinds import gradient
from autospec.train.run import _load_incumbent
from tests.tiny import tiny_target

OVERRIDES = {"eagle3": {"draft_vocab_size": 40, "suffix_threshold": None}, "draft": {}}


def _register(db, tiny, root: Path, kind: str) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Version ``v1``: a ``kind`` speculator with float32 weights bfloat16 cannot hold; its
    stored tensors."""
    spec = new_speculator(kind, tiny, **OVERRIDES[kind])
    with torch.no_grad():
        for p in spec.state_tensors().values():
            if p.is_floating_point():
                p.add_(0.01 * torch.randn_like(p))
    sha = save_speculator(spec, root)
    with store.session_scope(db) as session:
        store.register_speculator(session, version="v1", kind=kind,
                                  target_id=tiny.info.target_id,
                                  target_revision=tiny.info.revision,
                                  artifact_uri=str(root), sha256=sha)
    return {n: t.detach().clone() for n, t in spec.state_tensors().items()}


def _started(fresh, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """The stored tensors as the warm start should have placed them in ``fresh`` (eagle3:
    LM-head rows follow their token to its row in the new draft vocabulary)."""
    if "d2t" not in stored:
        return stored
    new_row = {int(t): i for i, t in enumerate(fresh.head.d2t.tolist())}
    rows = [new_row[int(t)] for t in stored["d2t"].tolist()]
    lm_head = fresh.head.lm_head.weight.detach().clone()
    lm_head[rows] = stored["lm_head.weight"]
    return {**stored, "lm_head.weight": lm_head, "d2t": fresh.head.d2t}


@pytest.mark.parametrize("kind", ["eagle3", "draft"])
def test_warm_start_on_a_bfloat16_target_begins_from_the_stored_float32_weights_tiny(
        db, tiny, tmp_path, kind) -> None:
    stored = _register(db, tiny, tmp_path / "v1", kind)
    assert not all(torch.equal(t, t.bfloat16().float()) for t in stored.values()
                   if t.is_floating_point())  # bfloat16 would round them
    bf16 = tiny_target(dtype=torch.bfloat16)  # the same target (id, revision) in bfloat16
    incumbent = _load_incumbent(db, "v1", bf16, "default")  # checksums verified
    fresh = new_speculator(kind, bf16, **OVERRIDES[kind])
    train = [TrainSequence(ids=[1, 2, 3, 4, 5, 6], prompt_len=2)]
    init = gradient(kind).recipe.prepare(fresh, train, bf16, incumbent)
    assert init["init"] == "incumbent"
    got = fresh.state_tensors()
    for name, want in _started(fresh, stored).items():
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), f"{name} is not the stored float32 tensor"

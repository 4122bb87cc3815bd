"""An imported speculators-format head is an incumbent like a trained one (tiny targets):
it serves in autospec's engine (greedy output = the target's) and the next training run
warm-starts from it, keeping its architecture (another head layout than autospec's default,
``norm_before_residual`` true as in heads trained elsewhere)."""

from __future__ import annotations

import torch

from autospec import store
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.interop.export import export_speculator
from autospec.interop.importer import import_head
from autospec.speculators.registry import new_speculator
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate
from autospec.versions import load_speculator_version

PUBLISHED = {"num_heads": 8, "num_kv_heads": 2, "intermediate_size": 48,
             "rope_theta": 500000.0, "norm_before_residual": True, "draft_vocab_size": 40,
             "suffix_threshold": None}


def _published_head(tiny, path):  # type: ignore[no-untyped-def]
    """A head as another trainer would publish it: speculators format, its own layout, none
    of autospec's settings (autospec-settings.json) nor manifest."""
    spec = new_speculator("eagle3", tiny, **PUBLISHED)
    export_speculator(spec, tiny, path, k=3)
    (path / "autospec-settings.json").unlink()
    (path / "manifest.json").unlink()
    return spec


def test_imported_head_tiny_random_init_serves_and_warm_starts_training(
        db_with_traffic, tiny, tmp_path) -> None:
    published = _published_head(tiny, tmp_path / "head")
    done = import_head(tmp_path / "head", target=tiny, engine=db_with_traffic)
    _, spec = load_speculator_version(db_with_traffic, tiny, done.version)
    assert spec.config.num_heads == 8 and spec.config.norm_before_residual is True
    assert spec.config.suffix_threshold == 0.7 and spec.config.suffix_tokens == 0  # no index yet

    prompt = list(range(5, 17))
    plain = tiny.model.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                                do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    served = SpeculativeEngine(tiny, spec, 3).generate(
        prompt, SamplingParams(max_new_tokens=20, ignore_eos=True))
    assert served.token_ids == plain  # the imported head serves (losslessly)

    with store.session_scope(db_with_traffic) as s:
        store.set_live(s, version=done.version, actor="test", reason="imported head")
    request = TrainRequest(kind="eagle3", epochs=1, window=WindowSpec(heldout_fraction=0.2),
                           overrides={"draft_vocab_size": 40})
    outcome = train_candidate(request, engine=db_with_traffic, target=tiny)
    assert outcome.parent == done.version and outcome.metrics["init"] == "incumbent"
    _, trained = load_speculator_version(db_with_traffic, tiny, outcome.version)
    assert trained.config.num_heads == 8 and trained.config.norm_before_residual is True
    assert trained.config.suffix_tokens > 0  # the next cycle adds autospec's traffic index
    before = published.head.layer.q_proj.weight
    after = trained.head.layer.q_proj.weight
    assert not torch.equal(before, after)  # trained further ...
    assert (after - before).norm() < before.norm()  # ... from the imported weights

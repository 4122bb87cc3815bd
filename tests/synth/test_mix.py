"""Synthetic sequences in a training window: at the share, of this target, never held out."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.synth.run import SynthRequest, synthesize
from autospec.train.data import SyntheticMix, WindowSpec, load_training_data, mix_synthetic
from autospec.train.errors import TrainingInputError
from autospec.train.run import TrainRequest, synthetic_target, train_candidate


def _window(engine, target, mix: SyntheticMix):  # type: ignore[no-untyped-def]
    with store.session_scope(engine, readonly=True) as session:
        data = load_training_data(session, WindowSpec(heldout_fraction=0.25))
        return mix_synthetic(session, data, mix, synthetic_target(target))


def test_the_share_is_kept_and_held_out_prompts_never_join(db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    synthesize(SynthRequest(count=40, max_new_tokens=6, batch_size=20, heldout_fraction=0.0),
               engine=db_with_traffic, target=tiny)  # every logged prompt, once
    data = _window(db_with_traffic, tiny, SyntheticMix(share=0.2))
    real = [s for s in data.train if not s.synthetic]
    synthetic = [s for s in data.train if s.synthetic]
    assert len(real) == 30 and len(data.heldout) == 10
    assert data.synthetic == len(synthetic) == round(30 * 0.2 / 0.8)  # 8 of 38 ≈ 0.2
    assert all(not s.synthetic for s in data.heldout)
    held_prompts = {tuple(s.ids[: s.prompt_len]) for s in data.heldout}
    assert not any(tuple(s.ids[: s.prompt_len]) in held_prompts for s in synthetic)
    assert data.describe()["synthetic_sequences"] == data.synthetic
    everything = _window(db_with_traffic, tiny, SyntheticMix(share=0.9, max_sequences=1000))
    assert everything.synthetic == 30  # the rows resampled from held-out prompts stay out


def test_off_other_targets_and_bad_shares(db_with_traffic, tiny, other_tiny) -> None:  # type: ignore[no-untyped-def]
    synthesize(SynthRequest(count=10, max_new_tokens=4), engine=db_with_traffic, target=tiny)
    assert _window(db_with_traffic, tiny, SyntheticMix(share=0.0)).synthetic == 0
    assert _window(db_with_traffic, other_tiny, SyntheticMix(share=0.5)).synthetic == 0
    with pytest.raises(TrainingInputError, match="synthetic share"):
        SyntheticMix(share=1.0)


def test_a_run_trains_on_the_mix_and_counts_real_requests(db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    synthesize(SynthRequest(count=30, max_new_tokens=8, heldout_fraction=0.0),
               engine=db_with_traffic, target=tiny)
    request = TrainRequest(kind="eagle3", epochs=1, window=WindowSpec(heldout_fraction=0.25),
                           overrides={"draft_vocab_size": 40},
                           synthetic=SyntheticMix(share=0.25))
    outcome = train_candidate(request, engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic, readonly=True) as session:
        run = store.get_training_run(session, run_id=outcome.run_id)
        assert run.train_requests == 30  # real requests only
        assert run.metrics["window"]["synthetic_sequences"] == 10
        assert run.config["synthetic"]["share"] == 0.25


def test_requests_resampled_into_a_versions_training_are_left_out_of_its_evaluation(
        db_with_traffic, tiny) -> None:  # type: ignore[no-untyped-def]
    """A version trained on the newest 10 requests plus synthetic sequences resampled from
    older ones trained on those older prompts too: its run records them and an evaluation
    replays none of them (it replayed them, the version's τ read high on its own prompts)."""
    from autospec.evaluate.run import select_requests
    from autospec.evaluate.unseen import trained_on, unseen

    synthesize(SynthRequest(count=40, max_new_tokens=4, heldout_fraction=0.0),
               engine=db_with_traffic, target=tiny)  # every logged prompt, once
    request = TrainRequest(kind="suffix", window=WindowSpec(limit=10, heldout_fraction=0.2),
                           synthetic=SyntheticMix(share=0.5))
    outcome = train_candidate(request, engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic, readonly=True) as session:
        origins = store.get_training_run(session, run_id=outcome.run_id
                                         ).metrics["window"]["synthetic_origins"]
    examples = select_requests(db_with_traffic, last=100)
    window_ids = {ex.id for ex in examples[-10:]}
    assert len(origins) == 8 and not set(origins) <= window_ids  # older requests' prompts
    kept, dropped = unseen(examples, trained_on(db_with_traffic, [outcome.version]))
    assert not {ex.id for ex in kept} & set(origins)
    assert {ex.id for ex in examples[-2:]} <= {ex.id for ex in kept}  # the held-out part
    assert dropped[outcome.version] == len(set(origins) | {ex.id for ex in examples[-10:-2]})

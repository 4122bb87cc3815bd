"""The plain loop on tiny random-init targets: loss falls, accuracy beats untrained, seeds."""

from __future__ import annotations

import itertools

import pytest
import torch

from autospec.speculators.registry import new_speculator
from autospec.train.data import TrainSequence
from autospec.train.features import FeatureCache, extract_features
from autospec.train.kinds import TraineeOptions, recipe
from autospec.train.loop import LoopConfig, LoopState, evaluate, get_lr, train_loop


@pytest.fixture(scope="module")
def seqs(traffic) -> list[TrainSequence]:
    return [TrainSequence(ids=p + o, prompt_len=len(p)) for p, o in traffic]


@pytest.fixture(scope="module")
def caches(tiny, seqs) -> tuple[FeatureCache, FeatureCache]:
    layers = new_speculator("eagle3", tiny).feature_layers
    return (extract_features(tiny, seqs[:48], feature_layers=layers),
            extract_features(tiny, seqs[48:], feature_layers=layers))


def _trainee(kind: str, tiny, seqs, *, loss: str = "kl", feature_noise: float = 0.0):
    spec = new_speculator(kind, tiny, **({"draft_vocab_size": 48} if kind == "eagle3" else {}))
    fit = recipe(kind)
    fit.prepare(spec, seqs[:48], tiny, None)
    opts = TraineeOptions(ttt_steps=3, loss=loss, eos_ids=tiny.info.eos_token_ids,
                          feature_noise=feature_noise)
    return spec, fit.trainee(spec, opts)


def test_feature_cache_tiny_random_init_matches_single_pass_and_round_trips(
        tiny, seqs, caches, tmp_path) -> None:
    train, _ = caches
    layers = new_speculator("eagle3", tiny).feature_layers
    one = tiny.forward(torch.tensor(seqs[3].ids), tiny.new_cache(), feature_layers=layers)
    span = train.span(3)
    torch.testing.assert_close(train.features[span].float(), one.features.bfloat16().float())
    first = int(train.prompt_lens[3]) - 1  # teachers only where the output is predicted
    assert torch.equal(train.top_ids[span][first:, 0].long(), one.logits[first:].argmax(-1))
    assert not train.top_ids[span][:first].any()
    assert train.features.dtype == torch.bfloat16 and train.top_logprobs.dtype == torch.float16
    train.save(tmp_path / "f.safetensors")
    back = FeatureCache.load(tmp_path / "f.safetensors")
    assert torch.equal(back.features, train.features) and torch.equal(back.ids, train.ids)


@pytest.mark.parametrize("loss", ["kl", "ce"])
def test_eagle3_tiny_random_init_loss_falls_and_beats_untrained(tiny, seqs, caches,
                                                                loss) -> None:
    train, held = caches
    _, trainee = _trainee("eagle3", tiny, seqs, loss=loss)
    before = evaluate(trainee, held)
    state = train_loop(trainee, train, LoopConfig(epochs=12, batch_size=8, lr=5e-3))
    after = evaluate(trainee, held)
    first, last = state.loss_curve[0][1], state.loss_curve[-1][1]
    assert last < first
    assert after["loss"] < before["loss"]
    assert after["accuracy"][0] > before["accuracy"][0] + 0.05  # first draft position
    assert state.examples_seen == 12 * 48


def test_draft_tiny_random_init_distillation_loss_falls(tiny, seqs, caches) -> None:
    train, held = caches
    _, trainee = _trainee("draft", tiny, seqs)
    before = evaluate(trainee, held)
    state = train_loop(trainee, train, LoopConfig(epochs=4, batch_size=8, lr=1e-3))
    assert state.loss_curve[-1][1] < state.loss_curve[0][1]
    assert evaluate(trainee, held)["loss"] < before["loss"]


def test_loop_tiny_random_init_is_deterministic_under_a_seed(tiny, seqs, caches) -> None:
    train, _ = caches
    states = []
    for _ in range(2):
        spec, trainee = _trainee("eagle3", tiny, seqs)
        train_loop(trainee, train, LoopConfig(epochs=2, seed=7))
        states.append(spec.state_tensors())
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name


class _Killed(Exception):
    pass


def test_loop_tiny_random_init_resume_equals_uninterrupted(tiny, seqs, caches) -> None:
    train, _ = caches
    cfg = LoopConfig(epochs=3, seed=3, warmup_steps=2)
    spec, trainee = _trainee("eagle3", tiny, seqs)
    train_loop(trainee, train, cfg)
    saved: list[tuple[dict, LoopState]] = []
    spec2, trainee2 = _trainee("eagle3", tiny, seqs)

    def checkpoint_then_die(state: LoopState) -> None:
        saved.append(({k: v.clone() for k, v in spec2.state_tensors().items()},
                      LoopState(epoch=state.epoch, step=state.step,
                                examples_seen=state.examples_seen,
                                loss_curve=list(state.loss_curve), optimizer=state.optimizer)))
        raise _Killed

    with pytest.raises(_Killed):
        train_loop(trainee2, train, cfg, on_epoch_end=checkpoint_then_die)
    # a new process: fresh modules, the checkpointed weights and loop state
    spec3, trainee3 = _trainee("eagle3", tiny, seqs)
    weights, state = saved[0]
    assert state.epoch == 1
    spec3.load_tensors(weights)
    final = train_loop(trainee3, train, cfg, resume=state)
    assert final.epoch == 3 and final.examples_seen == 3 * 48
    for name, tensor in spec.state_tensors().items():
        torch.testing.assert_close(tensor, spec3.state_tensors()[name], msg=name)


def test_get_lr_warms_up_then_decays() -> None:
    cfg = LoopConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [get_lr(s, 20, cfg) for s in range(20)]
    assert lrs[0] == 0.25 and lrs[3] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))
    assert lrs[-1] >= 0.1


def test_get_lr_follows_the_clock_under_a_time_budget() -> None:
    cfg = LoopConfig(lr=1.0, warmup_steps=2, min_lr_ratio=0.1, time_budget_s=100.0)
    assert get_lr(5, 1000, cfg, elapsed_s=0.0) == pytest.approx(get_lr(5, 1000, LoopConfig(
        lr=1.0, warmup_steps=2, min_lr_ratio=0.1)))
    assert get_lr(5, 1000, cfg, elapsed_s=50.0) == pytest.approx(0.55)  # half the budget
    assert get_lr(5, 1000, cfg, elapsed_s=100.0) == pytest.approx(0.1)  # budget used: the floor


def test_loop_tiny_random_init_stops_at_its_time_budget_with_a_final_checkpoint(
        tiny, seqs, caches, monkeypatch) -> None:
    import autospec.train.loop as loop_module

    train, _ = caches
    now = [0.0]

    def fake_clock() -> float:  # every reading advances one second: steps are 1 s apart
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(loop_module.time, "perf_counter", fake_clock)
    _, trainee = _trainee("eagle3", tiny, seqs)
    ends: list[LoopState] = []
    state = train_loop(trainee, train, LoopConfig(epochs=50, batch_size=8, time_budget_s=10.0),
                       on_epoch_end=ends.append)
    assert state.stopped_early and 3 <= state.step <= 10  # far fewer than 50 epochs' 300
    assert ends[-1] is state and state.epoch < 50  # the cut-short epoch was checkpointed
    untimed = train_loop(_trainee("eagle3", tiny, seqs)[1], train, LoopConfig(epochs=1))
    assert not untimed.stopped_early and untimed.step == 6


def test_eagle3_tiny_random_init_feature_noise_only_while_training(tiny, seqs, caches) -> None:
    train, _ = caches
    _, trainee = _trainee("eagle3", tiny, seqs, feature_noise=0.3)
    batch = trainee.make_batch(train, [0, 1, 2])
    trainee.train()
    with torch.no_grad():
        noisy = [float(trainee(**batch)[0]) for _ in range(2)]
    assert noisy[0] != noisy[1]  # fresh noise each step
    trainee.eval()
    with torch.no_grad():
        clean = [float(trainee(**batch)[0]) for _ in range(2)]
    assert clean[0] == clean[1]  # evaluation sees the features as they are


@pytest.mark.parametrize("left_on", ["inference_mode", "no_grad"])
def test_loop_tiny_random_init_trains_whatever_mode_its_thread_was_left_in(
        tiny, seqs, caches, left_on) -> None:
    """A test (or an in-process engine) that leaves its thread in inference mode, or with
    autograd off, must not break later training on that thread (CI, 2026-12-03 and -06)."""
    train, _ = caches
    spec, trainee = _trainee("eagle3", tiny, seqs)
    before = {n: t.clone() for n, t in spec.state_tensors().items()}
    mode = torch.inference_mode() if left_on == "inference_mode" else torch.no_grad()
    with mode:
        state = train_loop(trainee, train, LoopConfig(epochs=1))
        assert not torch.is_grad_enabled()  # the caller's mode is back after the loop
    assert state.step > 0
    assert any(not torch.equal(t, before[n]) for n, t in spec.state_tensors().items())

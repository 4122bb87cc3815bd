"""Issue 16 item 1: one source of truth for the serving numerics.

The target revision does not depend on the dtype the target is loaded in; a replica records
the target, revision and dtype it serves; training, evaluation and the controller use them
when not told otherwise and refuse others before any work. Tiny random-init targets."""

from __future__ import annotations

import pytest

from autospec import numerics, store
from autospec.engine.target import load_target
from autospec.numerics import NumericsMismatch
from autospec.speculators.checkpoint import load_speculator, save_speculator
from autospec.speculators.registry import new_speculator


def test_the_revision_does_not_depend_on_the_dtype_tiny(tiny_model_dir, tmp_path) -> None:
    fp32 = load_target(str(tiny_model_dir), dtype="float32", device="cpu")
    bf16 = load_target(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    assert bf16.dtype_name == "bfloat16" and fp32.dtype_name == "float32"
    assert fp32.info.revision == bf16.info.revision
    assert fp32.info.legacy_revision != bf16.info.legacy_revision  # the old, dtype-bound one
    # an artifact trained against the bf16 target is served by the fp32 one
    save_speculator(new_speculator("suffix", bf16), tmp_path / "a")
    assert load_speculator(tmp_path / "a", fp32).kind == "suffix"


def test_an_artifact_of_the_old_dtype_bound_revision_still_loads_tiny(
        tiny_model_dir, tmp_path) -> None:
    import json

    target = load_target(str(tiny_model_dir), dtype="float32", device="cpu")
    spec = new_speculator("ngram", target)
    old = spec.config.model_copy(update={"target_revision": target.info.legacy_revision})
    spec.config = old
    save_speculator(spec, tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    assert config["target_revision"] == target.info.legacy_revision != target.info.revision
    assert load_speculator(tmp_path / "old", target).kind == "ngram"


def test_resolve_uses_the_deployment_record_and_refuses_another_dtype_tiny(
        db, tiny_model_dir, tiny_llm) -> None:
    assert numerics.resolve(db, deployment="default") == ("smollm2-135m", "auto")
    bf16 = load_target(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    numerics.record_served(db, deployment="default", spec=str(tiny_model_dir), target=bf16,
                           actor="replica-a")
    assert numerics.resolve(db, deployment="default") == (str(tiny_model_dir), "bfloat16")
    assert numerics.resolve(db, deployment="default", dtype="auto")[1] == "bfloat16"
    assert numerics.resolve(db, deployment="other") == ("smollm2-135m", "auto")
    with pytest.raises(NumericsMismatch, match=r"serves .* in bfloat16.*--dtype float32"):
        numerics.resolve(db, deployment="default", dtype="float32")
    numerics.check_target(db, deployment="default", target=bf16)
    with pytest.raises(NumericsMismatch, match="in float32"):
        numerics.check_target(db, deployment="default", target=tiny_llm)  # fp32


def test_a_changed_deployment_is_audited_tiny(db, tiny_model_dir, tiny_llm) -> None:
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r1")
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r2")
    bf16 = load_target(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    numerics.record_served(db, deployment="default", spec="a", target=bf16, actor="r3")
    with store.session_scope(db, readonly=True) as session:
        notes = store.list_events(session, kinds=["note"])
    assert len(notes) == 1 and notes[0].details["to"]["dtype"] == "bfloat16"
    assert notes[0].details["from"]["dtype"] == "float32"


def test_replicas_recording_at_the_same_moment_both_succeed_tiny(
        db, tiny_llm, monkeypatch) -> None:
    from autospec.store import deployments

    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r1")
    real, calls = deployments.get_deployment, []

    def racing(session, *, name):  # type: ignore[no-untyped-def]
        calls.append(name)  # the first read misses the row another replica just inserted
        return None if len(calls) == 1 else real(session, name=name)

    monkeypatch.setattr(deployments, "get_deployment", racing)
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r2")
    assert len(calls) == 2
    assert numerics.served(db, deployment="default").recorded_by == "r2"


def test_the_engine_candidates_are_trained_for_follows_the_replicas_record_tiny(
        db, tiny_llm) -> None:
    assert numerics.engine_for(db, deployment="default", wanted="auto") == "native"  # none yet
    assert numerics.engine_for(db, deployment="default", wanted="vllm") == "vllm"
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r1",
                           engine="vllm")
    assert numerics.served(db, deployment="default").engine == "vllm"
    assert numerics.engine_for(db, deployment="default", wanted="auto") == "vllm"
    assert numerics.engine_for(db, deployment="default", wanted="vllm") == "vllm"
    with pytest.raises(NumericsMismatch, match=r"engine vllm .* `training.engine: auto`"):
        numerics.engine_for(db, deployment="default", wanted="native")
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r2")
    assert numerics.engine_for(db, deployment="default", wanted="auto") == "native"


def test_a_native_cpu_replica_records_its_torch_threads_a_vllm_one_none_tiny(
        db, tiny_llm) -> None:
    """The controller measures speed on the replicas' thread count (numerics.served)."""
    import torch

    assert numerics.served(db, deployment="default").threads is None  # nothing recorded
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r1")
    assert numerics.served(db, deployment="default").threads == torch.get_num_threads()
    numerics.record_served(db, deployment="default", spec="a", target=tiny_llm, actor="r2",
                           engine="vllm")
    assert numerics.served(db, deployment="default").threads is None

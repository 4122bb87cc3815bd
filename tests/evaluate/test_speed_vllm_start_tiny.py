"""The vLLM speed measurement's engine start (``speed_vllm._start``): a version whose data
cannot be loaded into the started engine closes that engine (it was no one's: leaked, it
held its memory for the controller's life) and is a ``VllmSpeedError`` naming the version
(the cycle's evaluation failure, a line of ``autospec evaluate``), not another exception.
vLLM itself is faked: no engine is started."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")


def test_a_load_that_fails_closes_the_engine_and_names_the_version(monkeypatch, tmp_path: Path):
    from autospec.engine.vllm import engine as engine_module
    from autospec.engine.vllm import swap
    from autospec.evaluate import speed_vllm
    from autospec.interop import export
    from autospec.speculators import registry

    closed: list[bool] = []

    class FakeEngine:
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            pass

        def close(self) -> None:
            closed.append(True)

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("collective_rpc timed out")

    monkeypatch.setattr(engine_module, "VllmEngine", FakeEngine)
    monkeypatch.setattr(swap, "load_in_place", broken)
    monkeypatch.setattr(swap, "draft_shape", lambda config, out: None)
    monkeypatch.setattr(export, "target_dir", lambda target: tmp_path)
    monkeypatch.setattr(export, "export_speculator", lambda *a, **k: SimpleNamespace(
        speculative_config={"method": "custom_class"}))
    monkeypatch.setattr(registry, "vllm_refusal", lambda *a: None)
    monkeypatch.setattr(registry, "vllm_seeded", lambda kind: True)
    target = SimpleNamespace(dtype_name="float32", info=None)
    with pytest.raises(speed_vllm.VllmSpeedError,
                       match="'suffix-0001' could not be loaded into vLLM: RuntimeError"):
        speed_vllm._start(target, "suffix-0001", "suffix", SimpleNamespace(), tmp_path, 3,
                          512, None)
    assert closed == [True]

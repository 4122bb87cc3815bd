"""Where the gate measures speed: a native deployment on autospec's engine one request at a
time; a vLLM deployment on vLLM at the concurrency its replicas recorded (or the policy's).
The vLLM measurement itself runs in tests/evaluate/test_speed_vllm.py (slow)."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.evaluate import run as run_module
from autospec.evaluate.run import ServingLoad, serving_load
from autospec.evaluate.speed import SpeedMeasurement
from autospec.evaluate.speed_settings import SpeedSettings
from autospec.store.models import utcnow


def _rows(db, loads: list[float], *, age: timedelta = timedelta(0)) -> None:  # type: ignore[no-untyped-def]
    store.write_requests(db, [store.RequestRecord(
        speculator_version="builtin-ngram", opted_out=True, output_tokens=8,
        sampling={"concurrency": x}, created_at=utcnow() - age) for x in loads])


def test_the_served_load_is_the_recorded_median_or_the_policys(sqlite_url) -> None:  # type: ignore[no-untyped-def]
    db = store.open_store(sqlite_url, upgrade=True)
    try:
        assert serving_load(db, deployment="default", engine="vllm") == ServingLoad("vllm", 1)
        _rows(db, [9.0] * 5, age=timedelta(days=3))  # too old: not the load served now
        _rows(db, [3.2, 3.6, 4.4, 5.0, 7.0])
        assert serving_load(db, deployment="default", engine="vllm") == ServingLoad("vllm", 4)
        assert serving_load(db, deployment="default", engine="vllm", concurrency=8) == \
            ServingLoad("vllm", 8)
    finally:
        db.dispose()


def test_a_vllm_deployment_is_measured_on_vllm_at_its_load(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Which measurement runs (the measurements themselves are tested on real engines)."""
    import autospec.evaluate.speed_vllm as speed_vllm

    calls = []
    made = SpeedMeasurement(speedup={"v": 1.2}, ratios={"v": [1.2]}, tokens_per_s={},
                            rounds=1, prompts=1, repeats=1, max_tokens=16, k=5,
                            engine="vllm", concurrency=4)

    def fake(target, loaded, prompts, **kw):  # type: ignore[no-untyped-def]
        calls.append((loaded, kw))
        return made

    monkeypatch.setattr(speed_vllm, "measure_speedups_vllm", fake)
    request = run_module.ReplayRequest(prompt_ids=[1, 2, 3], output_ids=[4], params=None,
                                       segment="s", request_id="r")
    got = run_module.measure_speed_vllm(None, {"v": ("ngram", None)}, [request], 5,  # type: ignore[arg-type]
                                        SpeedSettings(max_tokens=16, repeats=1), 4)
    assert got is made
    ((loaded, kw),) = calls
    assert loaded == {"v": ("ngram", None)}
    assert kw == {"k": 5, "concurrency": 4, "max_tokens": 16, "repeats": 1, "progress": None}
    assert run_module.measure_speed_vllm(None, {}, [request], 5,  # type: ignore[arg-type]
                                         SpeedSettings(enabled=False), 4) is None

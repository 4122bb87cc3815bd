"""End to end on a tiny target with a tokenizer: requests served over the OpenAI API are
logged → the controller trains a suffix candidate on them → shadow-evaluates it against the
built-in version → promotes it → the replica hot-swaps and responses name the new version
in ``x-autospec-speculator``."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autospec import store
from autospec.controller.cycle import Controller
from autospec.engine.target import Target, load_target
from autospec.serve.http import make_app

from .helpers import fast_policy, make_tokenizer_model_dir


def _serve_helpers():  # type: ignore[no-untyped-def]
    """tests/serve/helpers.py (the serving tests' in-process server)."""
    path = Path(__file__).resolve().parents[1] / "serve" / "helpers.py"
    spec = importlib.util.spec_from_file_location("autospec_serve_test_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


serve_helpers = _serve_helpers()

PROMPTS = ["The quick brown fox", "def add(a, b):", "Dear customer, thank you",
           "SELECT name FROM users"]
GREEDY = {"max_tokens": 16, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Target:
    directory = make_tokenizer_model_dir(tmp_path_factory.mktemp("tiny-llama"))
    return load_target(str(directory), dtype="float32", device="cpu")


def _status(cli: Any) -> dict:  # type: ignore[type-arg]
    """``autospec status --json``, failing with what it printed and raised."""
    import json

    from autospec.cli import app

    res = cli.invoke(app, ["status", "--json"])
    assert res.exit_code == 0, (res.output, repr(res.exception))
    return json.loads(res.stdout)


def _wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_traffic_in_candidate_trained_evaluated_promoted_served(
        tiny_llm: Target, sqlite_url: str, tmp_path: Path) -> None:
    db = store.open_store(sqlite_url, upgrade=True)
    server = serve_helpers.make_server(tiny_llm, db, poll_interval_s=0.1, speculator_k=4)
    try:
        with TestClient(make_app(server)) as client:
            for i in range(40):
                r = client.post("/v1/completions", json={
                    "prompt": PROMPTS[i % len(PROMPTS)], **GREEDY})
                assert r.status_code == 200
                assert r.headers["x-autospec-speculator"] == "builtin-ngram"
            assert server.writer is not None and server.writer.flush()
            assert _logged(db) == 40

            result = Controller(db, fast_policy(), tiny_llm).run_cycle(trigger="test")
            assert result.outcome == "promoted", result.reasons
            _wait_for(lambda: server.versions.current.name == result.promoted)

            r = client.post("/v1/completions", json={"prompt": PROMPTS[0], **GREEDY})
            assert r.status_code == 200
            assert r.headers["x-autospec-speculator"] == result.promoted
    finally:
        server.close()
        db.dispose()


def _logged(db) -> int:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return sum(store.request_counts(session).values())


@pytest.mark.slow
def test_serve_and_controller_with_their_defaults_promoted_version_is_served_tiny(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16 item 1: the replica built by ``LLMServer.from_config`` with the serving
    defaults (``dtype: auto``, bfloat16 here on any CPU) and ``autospec controller once``
    with its defaults (no --target, no --dtype) agree on the numerics: the controller reads
    what the replica recorded, refuses another dtype before training, and the version it
    promotes is the one served."""
    import json

    from typer.testing import CliRunner

    from autospec.cli import app
    from autospec.serve.config import ServeConfig
    from autospec.serve.server import LLMServer

    from .helpers import write_policy

    monkeypatch.setattr("autospec.engine.target.cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    model_dir = make_tokenizer_model_dir(tmp_path / "tiny-llama")
    store.open_store(sqlite_url, upgrade=True).dispose()
    config = ServeConfig(target=str(model_dir), model_name="tiny", database_url=sqlite_url,
                         poll_interval_s=0.1, report_interval_s=0.2, speculator_k=4)
    server = LLMServer.from_config(config, actor="replica-1")
    db = server.versions.db
    policy = str(write_policy(tmp_path / "policy.yaml"))
    cli = CliRunner()
    try:
        assert server.target.dtype_name == "bfloat16"
        with TestClient(make_app(server)) as client:
            for i in range(40):
                r = client.post("/v1/completions", json={
                    "prompt": PROMPTS[i % len(PROMPTS)], **GREEDY})
                assert r.status_code == 200
            assert server.writer is not None and server.writer.flush()

            other = cli.invoke(app, ["controller", "once", "--policy", policy,
                                     "--dtype", "float32"])
            assert other.exit_code == 2, other.output
            assert "in bfloat16" in other.output and "Traceback" not in other.output
            with store.session_scope(db, readonly=True) as session:
                assert store.list_training_runs(session) == []  # refused before training

            once = cli.invoke(app, ["controller", "once", "--policy", policy, "--json"])
            assert once.exit_code == 0, once.output
            promoted = json.loads(once.stdout)["promoted"]
            assert promoted
            _wait_for(lambda: server.versions.current.name == promoted)
            assert server.versions.load_failures == 0
            r = client.post("/v1/completions", json={"prompt": PROMPTS[0], **GREEDY})
            assert r.headers["x-autospec-speculator"] == promoted

            status = _status(cli)
            assert status["numerics"]["dtype"] == "bfloat16"
            _wait_for(lambda: _status(cli)[
                "served"] == {"versions": [promoted], "replicas": 1, "agrees": True})
    finally:
        server.close()

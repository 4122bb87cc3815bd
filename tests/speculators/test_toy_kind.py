"""A kind defined in this file alone — ``repeat``: propose the training window's most frequent
output token k times, fit from the window's documents — added to the registry for the test's
duration, then trained (``train_candidate``, the controller's path), shadow-evaluated
(:func:`autospec.evaluate.run.evaluate_versions`) and served (the native server, the version
pointed live), on a tiny random-init target: a new kind needs its module and one registry
entry, no other file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import torch
from fastapi.testclient import TestClient
from pydantic import Field

from autospec import store
from autospec.engine.protocol import Proposal
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target, load_target
from autospec.evaluate.gate import GatePolicy
from autospec.evaluate.run import evaluate_versions, select_requests
from autospec.evaluate.speed_settings import SpeedSettings
from autospec.serve.http import make_app
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import KindConfig
from autospec.speculators.kind import FitTraining, Kind
from autospec.speculators.registry import registered, trainable_kinds
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate
from tests.serve.helpers import make_server, make_tiny_model_dir, promote, wait_for_rows


# -- the toy kind: its config, its speculator, its training, its declaration ---------------
class RepeatConfig(KindConfig):
    """Propose one token over and over."""

    kind: Literal["repeat"] = Field(default="repeat", description="speculator kind tag")
    token: int = Field(default=0, ge=0, description="the token proposed; set by training")


class RepeatSpeculator(SavableSpeculator):
    kind = "repeat"

    def __init__(self, config: RepeatConfig, target: Target | None = None) -> None:
        self.config = config

    def begin(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        pass

    def commit(self, tokens: torch.Tensor, features: torch.Tensor | None) -> None:
        pass

    def propose(self, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        return Proposal(tokens=torch.full((k,), self.config.token, dtype=torch.long), probs=None)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if tensors:
            raise ValueError(f"repeat has no weights, got {sorted(tensors)}")


def fit_repeat(config: RepeatConfig, documents: list[tuple[list[int], list[int]]],
               target: Target) -> tuple[RepeatSpeculator, dict[str, Any]]:
    counts = Counter(token for _, output in documents for token in output)
    token, seen = counts.most_common(1)[0]
    spec = RepeatSpeculator(config.model_copy(update={"token": token}), target)
    return spec, {"token_share": seen / sum(counts.values())}


REPEAT = Kind(name="repeat", config=RepeatConfig, speculator=RepeatSpeculator,
              training=FitTraining(fit_repeat))


# -- fixtures: a tiny random-init target with a tokenizer, a server logging its traffic ----
@pytest.fixture(scope="module")
def tiny_random_init(tmp_path_factory: pytest.TempPathFactory) -> Target:
    return load_target(str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))),
                       dtype="float32", device="cpu")


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Any]:
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()


@pytest.fixture
def repeat_kind() -> Iterator[Kind]:
    with registered(REPEAT, "the window's most frequent output token, k times") as entry:
        yield entry


def test_toy_kind_tiny_random_init_trains_evaluates_and_serves(
        tiny_random_init: Target, db: Any, repeat_kind: Kind) -> None:
    server = make_server(tiny_random_init, db, poll_interval_s=60.0)
    try:
        with TestClient(make_app(server), raise_server_exceptions=False) as client:
            for i in range(12):  # traffic, served by the built-in version and logged
                r = client.post("/v1/completions", json={
                    "prompt": f"Request {i}: say something", "max_tokens": 10,
                    "ignore_eos": True})
                assert r.status_code == 200, r.text
            assert len(wait_for_rows(db, 12)) == 12
            assert "repeat" in trainable_kinds()

            outcome = train_candidate(TrainRequest(kind="repeat", min_requests=1,
                                                   window=WindowSpec(heldout_fraction=0.25)),
                                      engine=db, target=tiny_random_init)
            assert outcome.metrics["token_share"] > 0
            assert outcome.metrics["heldout_replay_tau_k5"] >= 1.0

            report = evaluate_versions(
                db=db, target=tiny_random_init, versions=[outcome.version, "builtin-ngram"],
                examples=select_requests(db, last=100), k=4, record=False,
                policy=GatePolicy(min_heldout=1), speed=SpeedSettings(enabled=False),
                synthetic_heldout=0)
            assert report.evaluation.tau[outcome.version] >= 1.0

            promote(db, outcome.version)
            assert server.versions.poll_once()
            r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 6})
            assert r.status_code == 200, r.text
            assert r.headers["x-autospec-speculator"] == outcome.version
            assert server.versions.current.kind == "repeat"
    finally:
        server.close()
    with store.session_scope(db, readonly=True) as session:
        assert store.get_speculator(session, version=outcome.version).kind == "repeat"

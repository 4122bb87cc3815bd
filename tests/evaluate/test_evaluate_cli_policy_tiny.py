"""``autospec evaluate`` measures speed as the policy in force says, as the controller's
cycles do (a decision it records is evidence for ``autospec promote``): the policy's
``evaluation.speed`` and synthetic held-out count, the command line's options in their
place where given. Tiny random-init target, real SQLite store; the evaluation itself is
replaced by a recorder (what it computes is tested elsewhere)."""

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator
from tests.train.conftest import greedy_traffic, log_traffic

POLICY = """name: slow-speed
evaluation:
  k: 3
  speed:
    enabled: false
    prompts: 7
    repeats: 3
    engine: native
training:
  synthetic:
    heldout_sequences: 5
"""


class _Stop(Exception):
    pass


@pytest.fixture
def calls(sqlite_url, tiny, tmp_path, monkeypatch):
    from autospec import numerics
    from autospec.evaluate import run

    engine = store.open_store(sqlite_url, upgrade=True)
    log_traffic(engine, greedy_traffic(tiny, 6, output_len=8))
    sha = save_speculator(new_speculator("suffix", tiny), tmp_path / "suffix-1")
    with store.session_scope(engine) as session:  # compared with builtin-ngram, none live
        store.register_speculator(session, version="suffix-1", kind="suffix",
                                  target_id=tiny.info.target_id,
                                  artifact_uri=str(tmp_path / "suffix-1"), sha256=sha)
    engine.dispose()
    seen: list[dict] = []

    def recorder(**kwargs):
        seen.append(kwargs)
        raise run.EvaluationError("recorded")
    monkeypatch.setattr(run, "evaluate_versions", recorder)
    monkeypatch.setattr(numerics, "load_served_target", lambda *a, **kw: tiny)
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    return seen


def _evaluate(tmp_path, *options: str) -> None:
    policy = tmp_path / "slow-speed.yaml"
    policy.write_text(POLICY)
    got = CliRunner().invoke(app, ["evaluate", "suffix-1", "--policy", str(policy),
                                   "--no-record", *options])
    assert got.exit_code == 2 and "recorded" in got.output, got.output


def test_evaluate_takes_the_policys_speed_settings_tiny_random_init(calls, tmp_path):
    _evaluate(tmp_path)
    (kw,) = calls
    speed = kw["speed"]
    assert (speed.enabled, speed.prompts, speed.repeats, speed.engine) == (False, 7, 3, "native")
    assert kw["synthetic_heldout"] == 5 and kw["k"] == 3


def test_evaluate_options_replace_the_policys_tiny_random_init(calls, tmp_path):
    _evaluate(tmp_path, "--speed", "--speed-prompts", "2", "--speed-max-tokens", "8",
              "--synthetic-heldout", "0")
    (kw,) = calls
    speed = kw["speed"]
    assert (speed.enabled, speed.prompts, speed.repeats, speed.max_tokens) == (True, 2, 3, 8)
    assert speed.engine == "native" and kw["synthetic_heldout"] == 0

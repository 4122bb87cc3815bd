"""``autospec evaluate`` end to end on the default target (short requests)."""

import json
import time

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import load_target
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator

pytestmark = pytest.mark.integration
PROMPTS = ["List the days of the week.", "Repeat after me: the quick brown fox jumps.",
           "Count from one to ten in words."]


@pytest.fixture(scope="module")
def target():
    return load_target("smollm2-135m", dtype="float32")


def test_evaluate_cli_table_json_and_exit_codes(target, sqlite_url, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    db = store.open_store(sqlite_url, upgrade=True)
    engine = SpeculativeEngine(target, new_speculator("ngram", target), 5)
    records = []
    for text in PROMPTS:
        ids = target.encode_chat([{"role": "user", "content": text}])
        res = engine.generate(ids, SamplingParams(max_new_tokens=24))
        s = res.stats
        records.append(store.RequestRecord(
            prompt_ids=ids, output_ids=res.token_ids, speculator_version="builtin-ngram",
            sampling={"max_tokens": 24}, num_drafts=s.num_drafts,
            num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens))
    store.write_requests(db, records)
    path = tmp_path / "eagle3-untrained"
    sha = save_speculator(new_speculator("eagle3", target), path)
    with store.session_scope(db) as session:
        store.register_speculator(session, version="eagle3-u", kind="eagle3",
                                  target_id=target.info.target_id,
                                  target_revision=target.info.revision,
                                  artifact_uri=str(path), sha256=sha)
    runner = CliRunner()
    started = time.perf_counter()
    # the traffic was decoded in float32 (no replica recorded the deployment's numerics)
    result = runner.invoke(app, ["evaluate", "eagle3-u", "--window", "10", "--dtype", "float32",
                                 "--json"])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 3, result.output  # rejected: exit code 3
    data = json.loads(result.stdout)
    assert data["versions"] == ["eagle3-u", "builtin-ngram"]  # one version: vs the live one
    assert data["num_requests"] == 3 and data["decision"]["promote"] is False
    live_tau = (sum(r.num_accepted_tokens for r in records) + sum(r.num_drafts for r in records)) \
        / sum(r.num_drafts for r in records)
    assert abs(data["tau"]["builtin-ngram"] - live_tau) <= 0.02 * live_tau
    assert data["speed_basis"] == "measured"  # estimated and measured side by side
    assert set(data["measured"]["speedup"]) == set(data["speedup"]) == {"eagle3-u",
                                                                       "builtin-ngram"}
    assert data["measured"]["rounds"] == 3 * 2  # 3 prompts (all there are) x 2 repeats
    assert data["policy_in_force"]["origin"] == "shipped-default"
    assert any("minimum 30" in r for r in data["decision"]["reasons"])  # default's min_heldout
    print(f"shadow evaluation: 3 requests x 2 versions in {elapsed:.1f}s (incl. target load)")

    table = runner.invoke(app, ["evaluate", "eagle3-u", "builtin-ngram", "--window", "10",
                                "--no-record", "--no-speed"])
    assert table.exit_code == 3 and "decision: reject" in table.stdout
    assert "speed not measured (--no-speed): the gate used the estimated speedup" in table.stdout
    strict = runner.invoke(app, ["evaluate", "eagle3-u", "--window", "10", "--no-record",
                                 "--no-speed", "--policy", "conservative", "--json"])
    assert strict.exit_code == 3, strict.output  # the gate of the policy named decides
    judged = json.loads(strict.stdout)
    assert judged["policy_in_force"]["name"] == "conservative"
    assert any("minimum 300" in r for r in judged["decision"]["reasons"])
    unknown = runner.invoke(app, ["evaluate", "nope", "--window", "10"])
    assert unknown.exit_code == 2 and "'nope' is not registered" in unknown.output
    assert "Traceback" not in unknown.output

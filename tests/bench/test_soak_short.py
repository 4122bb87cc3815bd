"""The soak's short form (issue 28): five minutes of constant traffic on a tiny
random-init target through ``autospec serve`` (native) and ``autospec controller run``, with
the faults that fit (a replica SIGKILL, the database locked, the controller SIGKILLed in
training, a corrupt version pointed live, the artifact directory read-only, an operator's
promotion and rollback of the deployment and of a segment) and ``autospec serve`` stopped
with SIGTERM at the end. Everything is accounted for: no failure a fault does not explain,
a traffic row for every answered request, no response from a version that was not live, no
process left."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from autospec.bench.soak.config import SoakConfig
from autospec.bench.soak.runner import Soak

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def _own_cache_dir() -> Iterator[None]:
    """The machine's cache (the embedded default's tokenizer), not the bench tests' own:
    the tiny target takes its tokenizer from there."""
    yield


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_short_soak_accounts_for_every_request(tmp_path: Path) -> None:
    cfg = SoakConfig(duration_s=300.0, rate=1.0, target="tiny", dtype="float32",
                     out=tmp_path / "soak", short=True, cycle_interval_s=40.0, warmup_s=60.0,
                     max_tokens=24)
    r = Soak(cfg, say=log.warning).run()
    req, rows = r["requests"], r["rows"]

    assert req["sent"] >= 250 and req["pending"] == 0
    assert req["failed_unexplained"] == 0, req["unexplained_examples"]
    assert rows["answered_without_row"] == 0, rows["missing_examples"]
    assert rows["duplicate_rows"] == 0 and rows["row_version_differs_from_header"] == 0
    rows_of_answers = rows["rows"] - sum(rows["rows_without_answer_by_client_outcome"].values())
    assert rows_of_answers == req["answered"]
    assert rows["spill_files_left"] == 0
    assert r["not_live"] == []
    assert r["shutdown"]["serve_exit_s"] is not None and r["shutdown"]["left_running"] == []
    faults = {f["name"]: f for f in r["faults"]}
    for name in ("replica SIGKILL mid-request", "database locked 20s",
                 "corrupt version pointed live by hand"):
        assert faults[name]["ok"], faults[name]
    assert all(f["ok"] for f in r["faults"] if not f["skipped"]), r["faults"]
    for name in ("soak.json", "soak.md", "soak.png"):
        assert (cfg.out / name).is_file()
    _judged_again_from_its_files(cfg.out, r)


def _judged_again_from_its_files(out: Path, r: dict) -> None:  # type: ignore[type-arg]
    """``autospec bench soak-report`` reads the run's files back: the same memory figures and
    verdict as the run's own report (the rules have not changed in between)."""
    import json

    from typer.testing import CliRunner

    from autospec.cli import app

    before = (out / "soak.md").read_text()
    res = CliRunner().invoke(app, ["bench", "soak-report", str(out)])
    assert res.exit_code == (1 if r["verdict"] else 0), res.output
    again = json.loads((out / "soak.json").read_text())
    assert again["memory"] == r["memory"] and again["verdict"] == r["verdict"]
    assert again["rejudged"]["verdict_before"] == r["verdict"]
    again_md = (out / "soak.md").read_text()
    said = [line for line in again_md.splitlines() if "judged again from the run's files" in line]
    assert len(said) == 1
    assert again_md.replace("\n\n" + said[0], "", 1) == before  # nothing else changed

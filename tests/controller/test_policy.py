"""Policies: shipped ones load (from the package, as from a wheel) and differ; every
mistake in a user's file is an error naming the file and the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.controller.policy import SHIPPED, PolicyError, load_policy, parse_policy
from autospec.shipped import shipped_dir

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_policies_are_package_resources_and_mean_different_things() -> None:
    for name in SHIPPED:
        assert (ROOT / "policies" / f"{name}.yaml").is_file()
        assert shipped_dir("policies").joinpath(f"{name}.yaml").is_file()
    default, conservative = load_policy("default"), load_policy("conservative")
    assert default.name == "default" and conservative.name == "conservative"
    assert default.schedule.interval is not None and conservative.schedule.cron is not None
    assert conservative.gate.min_gain > default.gate.min_gain
    assert conservative.gate.ci_level > default.gate.ci_level
    assert conservative.window.min_fresh_requests > default.window.min_fresh_requests
    assert conservative.canary.max_shortfall < default.canary.max_shortfall
    assert set(default.training.kinds) != set(conservative.training.kinds)


def test_a_users_policy_file_is_loaded_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nschedule: {cron: '*/15 * * * *'}\ngate: {min_gain: 0.2}\n")
    policy = load_policy(str(path))
    assert policy.name == "mine" and policy.gate.min_gain == 0.2
    assert policy.window.heldout_fraction == 0.2  # defaults fill the rest


BAD = [
    ("canary: {max_shortfal: 0.1}", "canary.max_shortfal", "unknown field"),
    ("training: {kinds: [eagle4]}", "training.kinds.0", "eagle3"),
    ("training: {kinds: []}", "training.kinds", "at least 1"),
    ("training: {kinds: [suffix, suffix]}", "training", "twice"),
    ("training: {use_gpu: true}", "training", "needs workers > 0"),
    ("schedule: {cron: '61 * * * *'}", "schedule.cron", "crontab"),
    ("schedule: {cron: '0 0 31 2 *'}", "schedule.cron", "never fires"),
    ("schedule: {cron: '0 3 30 2 *'}", "schedule.cron", "never fires"),
    ("schedule: {interval: 1h, cron: '0 3 * * *'}", "schedule", "exactly one"),
    ("window: {heldout_fraction: 1.5}", "window.heldout_fraction", "less than 1"),
    ("window: {max_requests: lots}", "window.max_requests", "integer"),
    ("lease: {ttl: 5 minutes}", "lease.ttl", "not a duration"),
    ("gate: {min_gain: -1}", "gate.min_gain", "greater than 0"),
    ("gate: {min_gian: 0.1}", "gate.min_gian", "unknown field"),
    ("scheduel: {interval: 1h}", "scheduel", "unknown field"),
    ("deployment: 'a b'", "deployment", "invalid deployment 'a b'"),
    ("deployment: ''", "deployment", "1-64 letters"),
    ("- just a list", "mine.yaml", "mapping"),
    ("window: {max_requests: [", "mine.yaml", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "field", "words"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_invalid_policy_files_name_the_field(tmp_path: Path, text: str, field: str,
                                             words: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(str(path))
    message = str(info.value)
    assert str(path) in message and field in message and words in message, message


def test_cli_reports_a_bad_policy_without_a_traceback(tmp_path: Path, sqlite_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    path = tmp_path / "mine.yaml"
    path.write_text("window: {min_fresh_requests: 0}\n")
    result = CliRunner().invoke(app, ["controller", "once", "--policy", str(path)])
    assert result.exit_code == 2
    assert "window.min_fresh_requests" in result.output and "Traceback" not in result.output
    from autospec import store

    store.open_store(sqlite_url, upgrade=True).dispose()  # (else: "database file ... does not")
    missing = CliRunner().invoke(app, ["status", "--policy", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "none.yaml does not exist" in missing.output


def test_a_shipped_name_means_the_shipped_policy_whatever_the_folder_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named ``default`` in the current directory was silently run as the policy,
    and a folder named ``conservative`` made ``--policy conservative`` "does not exist";
    such a file is read only when written as a path."""
    monkeypatch.chdir(tmp_path)
    Path("default").write_text("name: mine\n")
    Path("conservative").mkdir()
    assert load_policy("default").name == "default"
    assert load_policy("conservative").name == "conservative"
    assert load_policy("./default").name == "mine"
    assert load_policy(Path("default")).name == "mine"  # a Path is always a file


@pytest.mark.parametrize(("content", "words"), [
    (None, "is a directory, not a file"),  # it said "does not exist"
    (b"name: caf\xe9\n", "not UTF-8 text (invalid continuation byte at byte 9)"),  # traceback
])
def test_a_policy_that_is_no_text_file_is_one_line(tmp_path: Path, sqlite_url: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   content: bytes | None, words: str) -> None:
    from autospec import store

    store.open_store(sqlite_url, upgrade=True).dispose()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    path = tmp_path / "p9.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    for args in (["status"], ["controller", "once"], ["evaluate", "v1"]):
        result = CliRunner().invoke(app, [*args, "--policy", str(path)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], result.output


def test_status_and_evaluate_report_on_the_given_policys_deployment(
        tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `controller once --policy P` manages P's deployment; status reported on `default`
    whatever P named, and evaluate replayed `default`'s traffic under P's gate."""
    from autospec import store

    store.open_store(sqlite_url, upgrade=True).dispose()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    path = tmp_path / "prod.yaml"
    path.write_text("deployment: prod\n")
    status = CliRunner().invoke(app, ["status", "--policy", str(path), "--json"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["deployment"] == "prod"
    named = CliRunner().invoke(app, ["status", "--policy", str(path), "--deployment", "default",
                                     "--json"])
    assert json.loads(named.stdout)["deployment"] == "default"
    evaluated = CliRunner().invoke(app, ["evaluate", "builtin-ngram", "--policy", str(path)])
    assert evaluated.exit_code == 2 and "drafts for prod" in evaluated.output, evaluated.output


def test_durations_and_defaults() -> None:
    policy = parse_policy("schedule: {interval: 90m}\nwindow: {max_age: 7d}")
    assert policy.schedule.interval.total_seconds() == 5400
    assert policy.window.max_age.days == 7
    assert parse_policy("").name == "custom"


@pytest.mark.slow
def test_shipped_policies_load_from_an_installed_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    (wheel,) = wheels.glob("autospec-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import sys, autospec; assert autospec.__file__.startswith(sys.argv[1]); "
            "from autospec.shipped import shipped_dir; "
            "assert str(shipped_dir('policies')).startswith(sys.argv[1]); "
            "from autospec.controller.policy import load_policy; "
            "print(load_policy('default').name, load_policy('conservative').name)")
    done = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["default", "conservative"]

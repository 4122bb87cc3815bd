"""A database password never reaches what autospec prints, logs or stores.

The PostgreSQL URL carries a password (``s3cret``) that the local server's trust
authentication ignores, so every command really connects with it; then ``status --json``,
``history --json``, a whole controller cycle (its log at DEBUG, its JSON, its audit events),
a backup's index and the errors of failing commands are searched for it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.store.db import describe, redact
from tests.controller.helpers import log_traffic, write_policy

SECRET = "s3cret"
runner = CliRunner()


@pytest.fixture
def secret_url(postgres_url: str) -> str:
    return make_url(postgres_url).set(password=SECRET).render_as_string(hide_password=False)


@pytest.fixture
def cli(secret_url, tiny, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", secret_url)
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr("autospec.engine.target.load_target", lambda *a, **k: tiny)
    policy = write_policy(tmp_path / "policy.yaml")

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        extra = ["--policy", str(policy)] if args[0] in ("controller", "status") else []
        return runner.invoke(app, [*args, *extra])

    return invoke


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text, text


@pytest.mark.postgres
def test_a_controller_cycle_status_history_and_backup_never_show_the_password(
        cli, secret_url, traffic, tmp_path, caplog) -> None:
    assert cli("db", "upgrade").exit_code == 0
    engine = store.make_engine(secret_url)
    log_traffic(engine, traffic)
    caplog.set_level(logging.DEBUG)
    cycle = cli("controller", "once", "--json", "--log-level", "DEBUG")
    assert cycle.exit_code == 0, cycle.output
    assert json.loads(cycle.stdout)["outcome"] == "promoted"  # a whole cycle ran
    status = cli("status", "--json")
    history = cli("history", "--json")
    backup = cli("db", "backup", str(tmp_path / "bk"))
    assert status.exit_code == history.exit_code == backup.exit_code == 0, backup.output
    with store.session_scope(engine, readonly=True) as session:
        events = [json.dumps([e.reason, e.details], default=str)
                  for e in store.list_events(session, limit=1000)]
    engine.dispose()
    assert events and caplog.text
    files = [p.read_text("utf-8", errors="replace") for p in (tmp_path / "bk").rglob("*.json*")]
    _no_secret(cycle.output, status.output, history.output, backup.output, caplog.text,
               *events, *files)


@pytest.mark.postgres
def test_failing_commands_name_the_database_without_its_password(cli, secret_url) -> None:
    url = make_url(secret_url)
    unreachable = url.set(port=1).render_as_string(hide_password=False)
    malformed = secret_url.replace(f":{url.port}/", ":no-port/")
    for bad in (unreachable, malformed):
        result = runner.invoke(app, ["status", "--json"], env={"AUTOSPEC_DATABASE_URL": bad})
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert "***" in result.output, result.output  # the database is still named
        _no_secret(result.output)


def test_redaction_of_urls_sqlalchemy_cannot_parse() -> None:
    for url in (f"postgresql+psycopg://root:{SECRET}@127.0.0.1:xx/db",
                f"postgresql://root:{SECRET}/x@host/db", f"mysql://u:{SECRET}@h:99999999999/d"):
        _no_secret(describe(url), redact(f"error: {url} failed"))
    with pytest.raises(store.BadDatabaseURL) as exc:
        store.make_engine(f"postgresql+psycopg://root:{SECRET}@127.0.0.1:xx/db")
    assert "root:***@127.0.0.1:xx" in str(exc.value)
    assert redact("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
    assert describe(Path("/tmp/x").as_posix()) == "'/tmp/x'"


def test_a_password_given_as_a_query_parameter_is_masked() -> None:
    urls = (f"postgresql://root@127.0.0.1:5432/x?password={SECRET}",
            f"postgresql+psycopg://root@h/x?sslmode=require&sslpassword={SECRET}",
            f"postgresql://root@h/x?pass%77ord={SECRET}",  # percent-encoded name
            f"postgresql://root@h:xx/x?PASSWORD={SECRET}")  # unparseable: redact()
    for url in urls:
        _no_secret(describe(url), redact(f"error: {url} failed"))
        assert "=***" in describe(url), describe(url)
    shown = describe("postgresql://root@h/x?passfile=/home/r/.pgpass&sslmode=require")
    assert shown == "postgresql://root@h/x?passfile=%2Fhome%2Fr%2F.pgpass&sslmode=require"
    with pytest.raises(store.BadDatabaseURL) as exc:
        store.make_engine(f"postgresql+psycopg://root@127.0.0.1:xx/db?password={SECRET}")
    assert "password=***" in str(exc.value)
    # libpq's keyword form (no URL: refused as malformed, quoting what it was given), a
    # quoted value, and a value holding '#' (no fragment outside a URL)
    for text in (f"host=db password={SECRET} dbname=x", f"host=db password='{SECRET} 2'"):
        with pytest.raises(store.BadDatabaseURL) as exc:
            store.make_engine(text)
        _no_secret(str(exc.value), describe(text))
    hashed = f"postgresql://root@h/x?password=ab#{SECRET}"
    _no_secret(redact(f"error: {hashed} failed"), describe(hashed))
    assert redact("max_tokens=5 tokens=3") == "max_tokens=5 tokens=3"  # no secret's name


@pytest.mark.postgres
def test_a_query_password_stays_out_of_backups_restores_and_errors(
        postgres_url: str, tmp_path: Path) -> None:
    url = make_url(postgres_url).update_query_dict({"password": SECRET})
    secret_url = url.render_as_string(hide_password=False)
    assert SECRET in secret_url
    bk = tmp_path / "bk"
    upgrade = runner.invoke(app, ["db", "upgrade", "--url", secret_url])
    backup = runner.invoke(app, ["db", "backup", str(bk), "--url", secret_url])
    assert upgrade.exit_code == backup.exit_code == 0, backup.output
    index = json.loads((bk / "backup.json").read_text("utf-8"))
    assert "password=***" in index["source"], index["source"]
    _no_secret(upgrade.output, backup.output, *(p.read_text("utf-8") for p in bk.rglob("*.json*")))
    index["source"] = secret_url  # as a backup taken before the mask holds it
    (bk / "backup.json").write_text(json.dumps(index), "utf-8")
    restore = runner.invoke(app, ["db", "restore", str(bk), "--url", secret_url, "--force"])
    assert restore.exit_code == 0, restore.output
    engine = store.make_engine(secret_url)
    with store.session_scope(engine, readonly=True) as session:
        events = [json.dumps([e.reason, e.details], default=str)
                  for e in store.list_events(session, limit=1000)]
    engine.dispose()
    assert any("restored from backup" in e for e in events), events
    unreachable = url.set(port=1).render_as_string(hide_password=False)
    failed = runner.invoke(app, ["db", "backup", str(tmp_path / "bk2"), "--url", unreachable])
    assert failed.exit_code != 0 and "password=***" in failed.output, failed.output
    _no_secret(restore.output, *events, failed.output)

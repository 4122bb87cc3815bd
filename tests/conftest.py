"""Shared fixtures.

- every test runs with ``AUTOSPEC_DATA_DIR`` in its own temporary directory;
- ``sqlite_url``: a fresh SQLite file per test;
- ``postgres_url``: a fresh PostgreSQL database per test, created on the server named by
  ``AUTOSPEC_TEST_POSTGRES_URL``, or when that is unset on the server answering on
  127.0.0.1:5432 (as ``root``; see ``tests/postgres.py``), and dropped afterwards. Neither →
  the test is skipped with a message saying so; the variable set but the server unreachable
  → the test fails (it never passes without having run); a local server that answers but
  refuses ``root`` → skipped, naming the error and the variable to set;
- ``db_url``: both of the above (the PostgreSQL case carries the ``postgres`` marker);
- ``engine``: an Engine on ``db_url`` migrated to head.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile``). Each test
module runs whole on one worker (its module-scoped fixtures built once), and the modules in
:data:`RAY_MODULES`, which start a Ray cluster or ``autospec serve``, run as one unit: one
local Ray at a time, as in a serial run, while the other worker runs the rest
(:func:`pytest_xdist_make_scheduler`).

Torch runs on one thread in tests (and in the subprocesses and Ray workers they start):
the models here are tiny or small, and on a 2-core machine shared with Ray actors, OpenMP
threads spinning at barriers made tiny-model forwards up to 30x slower.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import POSTGRES_ENV, server_url

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


#: the modules that start a Ray cluster (in process, ``autospec serve``, the soak, the
#: demo): one unit under pytest-xdist, run one after another on one worker
RAY_MODULES = frozenset({
    "tests/bench/test_soak_short.py",
    "tests/cluster/test_first_deploy.py", "tests/cluster/test_multinode.py",
    "tests/demo/test_demo.py", "tests/security/test_ray_loopback.py",
    "tests/serve/test_ray_e2e.py", "tests/serve/test_shutdown.py",
    "tests/serve/test_vllm_ray.py", "tests/train/test_ray.py",
    "tests/train/test_ray_cluster.py",
})
ROOT = Path(__file__).resolve().parent.parent
REAL_SET_NUM_THREADS = None  # torch's own, kept when pytest starts (pytest_configure)


def xdist_scope(nodeid: str) -> str:
    """The unit a pytest-xdist worker runs whole: "ray" for the tests of
    :data:`RAY_MODULES`, else the test's module."""
    module = nodeid.split("::", 1)[0]
    return "ray" if module in RAY_MODULES else module


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, there only when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile`` (``make test``), with the Ray modules one unit: xdist's own
    ``loadgroup`` cannot be used, its groups are lost on pytest 9.2 (it renames items through
    an attribute pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ModulesAndRay(config, log)


def pytest_configure(config: pytest.Config) -> None:
    global REAL_SET_NUM_THREADS
    import torch

    REAL_SET_NUM_THREADS = torch.set_num_threads

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _grad_mode_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with autograd on and inference mode off; one that leaves autograd
    off, or its thread in inference mode, is named in a warning (a test that did so broke
    later tests that train, in CI on 2026-12-03 and 2026-12-06; train_loop now trains
    whatever the mode). A leaked inference mode cannot be undone from outside its guard:
    each later test runs inside ``inference_mode(False)``."""
    import warnings

    import torch

    off = None
    if torch.is_inference_mode_enabled():  # left on by an earlier test: off for this one
        off = torch.inference_mode(False)
        off.__enter__()
    torch.set_grad_enabled(True)
    yield
    if off is not None:
        off.__exit__(None, None, None)  # back to what the earlier test left
    elif torch.is_inference_mode_enabled():
        warnings.warn(f"{request.node.nodeid} left its thread in inference mode", stacklevel=1)
    elif not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        warnings.warn(f"{request.node.nodeid} left autograd disabled", stacklevel=1)


@pytest.fixture(autouse=True)
def _set_num_threads_restored() -> Iterator[None]:
    """vLLM's CPU worker, built in this process (tests that start an engine in-process),
    replaces ``torch.set_num_threads`` with a no-op for the rest of the process; later tests
    (under xdist, whatever module ran before on the worker) get the real one back."""
    import torch

    yield
    torch.set_num_threads = REAL_SET_NUM_THREADS


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "autospec-data"))
    monkeypatch.delenv("AUTOSPEC_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'autospec.db'}"


def _admin_engine():  # type: ignore[no-untyped-def]
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base, source = server_url()
    if base is None:
        pytest.skip(source)
    url = make_url(base)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    engine = create_engine(url, isolation_level="AUTOCOMMIT",
                           connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        if source != POSTGRES_ENV:
            pytest.skip(f"{source}, but {base} cannot connect ({exc}); set {POSTGRES_ENV}")
        pytest.fail(f"{POSTGRES_ENV}={base} is set but the server is unreachable: {exc}")
    return engine


@pytest.fixture
def postgres_url() -> Iterator[str]:
    from sqlalchemy import text

    admin = _admin_engine()
    name = f"autospec_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def engine(db_url: str):  # type: ignore[no-untyped-def]
    from autospec.store import db, migrate

    eng = db.make_engine(db_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
def tiny():  # type: ignore[no-untyped-def]
    """A 4-layer, 64-token, 32-wide random-init Llama target (EOS = 63, no tokenizer)."""
    from tests.tiny import tiny_target

    return tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=0)


@pytest.fixture(scope="session")
def other_tiny():  # type: ignore[no-untyped-def]
    """Another tiny target (another id and revision)."""
    from tests.tiny import tiny_target

    return tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=1)

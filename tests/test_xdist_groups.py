"""The xdist units of tests/conftest.py stay true: every module named in ``RAY_MODULES``
exists, and every test module that starts a Ray cluster (in process, through ``autospec
serve``, the soak or the demo) is named there, so two never run at once under ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import RAY_MODULES, ROOT, pytest_xdist_make_scheduler, xdist_scope

STARTS_RAY = re.compile(r"ray\.init\(|start_local\(|\bSoak\(|from tests\.cluster|mark\.e2e|"
                        r"ray_listen_probe|\"autospec\.cli\", \"(serve|demo)\"")


def test_every_named_module_exists() -> None:
    assert RAY_MODULES
    for module in RAY_MODULES:
        assert (ROOT / module).is_file(), module


def test_every_module_that_starts_ray_is_in_the_ray_group() -> None:
    starting = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
                if p != Path(__file__) and STARTS_RAY.search(p.read_text())}
    assert starting - RAY_MODULES == set()
    assert starting, "the pattern finds nothing: it no longer matches how tests start Ray"


def test_a_module_is_its_own_unit_and_the_ray_modules_one() -> None:
    assert xdist_scope("tests/serve/test_ray_e2e.py::test_x[a]") == "ray"
    assert xdist_scope("tests/train/test_ray.py::test_y") == "ray"
    assert xdist_scope("tests/test_ports.py::test_z") == "tests/test_ports.py"


def test_make_tests_scheduler_runs_the_units_whole(pytestconfig, monkeypatch) -> None:
    scheduler = pytest.importorskip("xdist.scheduler")
    # its workers' settings are not needed to split node ids
    monkeypatch.setattr(scheduler.LoadScopeScheduling, "__init__", lambda self, config, log: None)
    monkeypatch.setattr(pytestconfig.option, "dist", "loadfile", raising=False)
    sched = pytest_xdist_make_scheduler(pytestconfig, None)
    assert sched._split_scope("tests/bench/test_soak_short.py::test_s") == "ray"
    assert sched._split_scope("tests/test_ports.py::test_z[1]") == "tests/test_ports.py"
    monkeypatch.setattr(pytestconfig.option, "dist", "load", raising=False)
    assert pytest_xdist_make_scheduler(pytestconfig, None) is None  # xdist's own

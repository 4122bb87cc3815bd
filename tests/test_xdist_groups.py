"""The xdist groups of tests/conftest.py stay true: every module named in ``RAY_MODULES``
exists, and every test module that starts a Ray cluster (in process, through ``autospec
serve``, the soak or the demo) is named there, so two never run at once under ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import RAY_MODULES, ROOT, xdist_group

STARTS_RAY = re.compile(r"ray\.init\(|start_local\(|Soak\(|from tests\.cluster|mark\.e2e|"
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


def test_other_modules_are_their_own_group() -> None:
    assert xdist_group(ROOT / "tests/serve/test_ray_e2e.py") == "ray"
    assert xdist_group(Path(__file__)) == "tests/test_xdist_groups.py"

"""The shape the house keeps: no module of the package over 450 lines, no function whose
body is over 60 lines (read with `ast`, docstring included), so a module keeps one job and a
function fits on a screen. `python -m tests.test_code_shape` lists what is over."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450
MAX_BODY_LINES = 60


def _modules() -> list[Path]:
    return sorted((ROOT / "autospec").rglob("*.py"))


def long_modules(limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """Modules over ``limit`` lines → their length."""
    found = {}
    for path in _modules():
        n = len(path.read_text().splitlines())
        if n > limit:
            found[str(path.relative_to(ROOT))] = n
    return found


def long_functions(limit: int = MAX_BODY_LINES) -> dict[str, int]:
    """``path:function`` whose body spans over ``limit`` lines → the body's length."""
    found = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[-1].end_lineno - node.body[0].lineno + 1  # type: ignore[operator]
                if body > limit:
                    found[f"{path.relative_to(ROOT)}:{node.name}"] = body
    return found


def test_the_checks_see_long_code(tmp_path: Path) -> None:
    source = "def f():\n" + "    x = 1\n" * (MAX_BODY_LINES + 1)
    tree = ast.parse(source)
    fn = tree.body[0]
    assert fn.body[-1].end_lineno - fn.body[0].lineno + 1 > MAX_BODY_LINES  # type: ignore[attr-defined]
    assert long_modules(limit=10) and long_functions(limit=5)


def test_no_module_over_450_lines() -> None:
    assert long_modules() == {}


def test_no_function_body_over_60_lines() -> None:
    assert long_functions() == {}


if __name__ == "__main__":
    for name, n in {**long_modules(), **long_functions()}.items():
        print(f"{n:5d}  {name}")

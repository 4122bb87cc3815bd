"""τ has one formula: :func:`autospec.engine.stats.tau`. Everything else calls it.

The package's code (docstrings and comments left out: prose may state the formula) is
searched for a second way to write it:

- ``(X + S) / S``, the same ``S`` on both sides: ``(accepted + steps) / steps``,
  ``(self.num_accepted_tokens + self.num_drafts) / self.num_drafts``,
  ``(a["accepted"] + a["steps"]) / a["steps"]``, ``(w @ acc + total) / total``...;
- ``1 + accepted / S`` or ``accepted / S + 1``, an acceptance count over a count plus one.

The only match allowed is the formula's own line in ``engine/stats.py``. Run
``python -m tests.engine.test_tau_once [PACKAGE_DIR]`` to list what it finds elsewhere.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autospec"
THE_ONE = ("engine/stats.py", "return (accepted + steps) / steps if steps else None")

_OPERAND = r"""[\w.\[\]"'@() ]+?"""  # a name, attribute, subscript or call: steps, a["steps"]
FORMULAS = [
    re.compile(rf"\+\s*(?P<steps>{_OPERAND})\s*\)\s*/\s*(?P=steps)(?![\w.\[(])"),
    re.compile(rf"\b1\s*\+\s*[\w.\[\]\"']*accept\w*[\w.\[\]\"'()]*\s*/\s*{_OPERAND}"),
    re.compile(r"accept\w*[\w.\[\]\"'()]*\s*/\s*[\w.\[\]\"'()]+\s*\+\s*1\b(?!\.?\d)"),
]


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return first
    return None


def code_only(source: str) -> list[str]:
    """``source``'s lines with docstrings and comments blanked (line numbers kept)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if (doc := _docstring(node)) is not None:
            for i in range(doc.lineno - 1, doc.end_lineno or doc.lineno):
                lines[i] = ""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return lines


def formulas(package: Path) -> list[tuple[str, int, str]]:
    """Every (file relative to ``package``, line, code) writing τ's formula; one that spans
    a line break is found on the line it starts on (each line is searched joined with the
    next)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = [*code_only(path.read_text()), ""]
        for i, line in enumerate(lines[:-1]):
            head = line.strip()
            joined = f"{head} {lines[i + 1].strip()}"
            starts = [m.start() for f in FORMULAS for m in f.finditer(joined)]
            if any(at < len(head) for at in starts):
                found.append((path.relative_to(package).as_posix(), i + 1, head))
    return found


def test_the_patterns_catch_the_ways_tau_was_written_before() -> None:
    written = [
        "return (accepted + steps) / steps if steps else 1.0",
        "return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts",
        'return float((accepted.sum() + steps.sum()) / steps.sum()) if steps.sum() else 1.0',
        "return (weights @ acc + total_steps) / total_steps",
        '"tau": (sum(a.accepted for a in answers) + steps) / steps if steps else 1.0}',
        '"tau": (a["accepted"] + a["steps"]) / a["steps"] if a["steps"] else 1.0,',
        "return (self.accepted_tokens + self.steps) / self.steps if self.steps else None",
        "tau = 1 + stats.num_accepted_tokens / stats.num_drafts",
        "tau = accepted / steps + 1",
    ]
    for line in written:
        assert any(f.search(line) for f in FORMULAS), line
    for fine in ["rate = accepted / proposed", "x = (a + b) / c", "n = (k + 1) / 2",
                 "pos + new < len(out)", "return accepted / drafted + 1.5"]:
        assert not any(f.search(fine) for f in FORMULAS), fine


def test_the_search_skips_docstrings_and_comments_and_joins_broken_lines(tmp_path) -> None:
    (tmp_path / "m.py").write_text(
        '"""τ = (accepted + steps) / steps."""\n'
        "x = 1  # (accepted + steps) / steps\n"
        "def f(accepted, steps):\n"
        "    return ((accepted +\n"
        "             steps) / steps)\n")
    assert formulas(tmp_path) == [("m.py", 4, "return ((accepted +")]


def test_no_step_is_no_measurement() -> None:
    from autospec.engine.stats import RequestStats, tau

    assert tau(3, 2) == 2.5 and tau(0, 4) == 1.0 and tau(1.5, 3) == 1.5
    assert tau(0, 0) is None and RequestStats().tau is None
    stats = RequestStats()
    stats.observe_step(4, 2)
    assert stats.tau == 3.0 and stats.as_dict()["tau"] == 3.0
    assert RequestStats().as_dict()["tau"] is None
    from autospec.serve.schemas import AutospecInfo  # the response's autospec object

    assert AutospecInfo.from_stats("v", RequestStats()).model_dump()["tau"] is None


def test_tau_is_written_once() -> None:
    found = formulas(PACKAGE)
    assert [(f, code) for f, _, code in found] == [THE_ONE], (
        "τ computed outside autospec.engine.stats.tau (call it instead):\n"
        + "\n".join(f"  autospec/{f}:{n}: {code}" for f, n, code in found
                    if (f, code) != THE_ONE))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    for file, line, code in formulas(root):
        print(f"{file}:{line}: {code}")

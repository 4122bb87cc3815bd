"""A benchmark says what it is doing: one line per finished run, partial JSON as it goes.

:class:`BenchProgress` holds the report a benchmark is filling in. :meth:`~BenchProgress.stage`
names what runs now (printed when it starts, and kept in the JSON as ``stage``, so a
benchmark stopped by a timeout leaves a file that says where); :meth:`~BenchProgress.done`
prints a line with a finished run's figures and rewrites the JSON (``complete: false``);
:meth:`~BenchProgress.finish` marks it complete. The JSON is replaced atomically, so a
reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from autospec.jsonout import json_default


class BenchProgress:
    """Progress lines and partial JSON of one benchmark (``name``: ``bench decode``)."""

    def __init__(self, name: str, report: dict[str, Any], json_path: Path | None,
                 console: Console | None = None) -> None:
        self.name, self.report, self.json_path = name, report, json_path
        self.console = console or Console(stderr=True)
        self.t0 = time.perf_counter()
        report.update(complete=False, stage="starting")
        self.save()

    @contextmanager
    def stage(self, what: str) -> Iterator[None]:
        """Name what runs inside (printed now, and the JSON's ``stage`` until the next)."""
        self.report["stage"] = what
        self.console.print(Text(f"{self.name} [{self._clock()}] {what}…", style="dim"))
        self.save()
        yield

    def done(self, line: str) -> None:
        """A run finished (its figures are already in the report): print ``line``, save."""
        self.console.print(Text(f"{self.name} [{self._clock()}] {line}"))
        self.save()

    def finish(self) -> None:
        self.report["complete"] = True
        self.report.pop("stage", None)
        self.save()

    def save(self) -> None:
        if self.json_path is None:
            return
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.json_path.with_name(self.json_path.name + ".partial")
        scratch.write_text(json.dumps(self.report, indent=2, default=json_default) + "\n")
        os.replace(scratch, self.json_path)

    def _clock(self) -> str:
        seconds = int(time.perf_counter() - self.t0)
        return f"{seconds // 60:d}:{seconds % 60:02d}"

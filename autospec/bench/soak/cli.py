"""The body of ``autospec bench soak``: checks the options, runs, prints the verdict."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer
from pydantic import ValidationError

from autospec.bench.soak.config import SoakConfig
from autospec.bench.soak.faults import FAULTS
from autospec.option_errors import first_error
from autospec.stopping import exit_on_sigterm, stop_now

#: seconds an interrupted soak gives ``autospec serve`` to shut its Ray down before killing
#: what is left below it
STOP_GRACE_S = 30.0
#: the option of each SoakConfig field not named after it
SOAK_OPTIONS = {"duration_s": "duration", "warmup_s": "duration",
                "cycle_interval_s": "cycle_interval"}


def run_soak(*, duration_min: float, rate: float, engine: str, target: str, dtype: str,
             out: Path, max_tokens: int, cycle_interval_s: float, short: bool,
             faults: str | None) -> int:
    """0: every goal met; 1: some missed (listed); 2: bad options."""
    from autospec.bench.soak.runner import Soak

    names = None if faults is None else [f.strip() for f in faults.split(",") if f.strip()]
    unknown = sorted(set(names or []) - set(FAULTS))
    if unknown:
        raise typer.BadParameter(f"--faults: unknown {unknown}; known: {', '.join(FAULTS)}")
    try:
        cfg = SoakConfig(duration_s=duration_min * 60, rate=rate, engine=engine,  # type: ignore[arg-type]
                         target=target, dtype=dtype, out=out, max_tokens=max_tokens,
                         cycle_interval_s=cycle_interval_s, short=short, faults=names,
                         warmup_s=min(120.0, duration_min * 60 / 4))
    except ValidationError as exc:  # one line naming the option, as every command's
        raise typer.BadParameter(first_error(exc, SOAK_OPTIONS)) from None
    logging.basicConfig(level=logging.WARNING)

    def say(line: str) -> None:
        typer.echo(f"{time.strftime('%H:%M:%S')} {line}")

    exit_on_sigterm(grace_s=STOP_GRACE_S)
    try:
        result = Soak(cfg, say).run()
    except KeyboardInterrupt:
        say("interrupted: stopping autospec serve and the controllers (no report)")
        stop_now(130, STOP_GRACE_S)
    say(f"report: {cfg.out / 'soak.md'}")
    for line in result["verdict"]:
        say(f"MISSED: {line}")
    return 1 if result["verdict"] else 0

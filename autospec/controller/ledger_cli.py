"""``autospec ledger``: does the loop pay for itself? The decode time speculation saved a
deployment over a period against the time its controller's cycles spent, per segment and
in total (:mod:`autospec.ledger`). ``autospec status`` shows the same ledger for
its ``--period``; this command is for a deployment and period of one's choosing, or a
script (``--json``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

import typer

from autospec.cli_options import deployment_name
from autospec.controller.cli import DbUrl, _db, _emit, _errors, out


def _until(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO time like 2026-12-03T16:00",
                                 param_hint="--until") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def ledger(
    deployment: Annotated[str, typer.Option(
        callback=deployment_name, help="the deployment to account for")] = "default",
    period: Annotated[str, typer.Option(
        help="how far back from --until: a duration such as 24h, 90m, 7d")] = "24h",
    until: Annotated[str | None, typer.Option(
        help="the period's end, an ISO time up to now (UTC unless it says otherwise; "
        "default: now)")
    ] = None,
    database_url: DbUrl = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Decode time saved by speculation (tokens served ÷ the target-only rate, minus the
    decode time the requests took) against the time the controller's cycles spent
    (features, training, shadow evaluation, speed measurement), and the net, per segment
    and in total. The target-only rate is the period's held-out requests' where there are
    10 (serve --holdout-fraction), else the gate's. See docs/ledger.md."""
    from autospec.controller.ledger_view import ledger_table
    from autospec.durations import parse_duration
    from autospec.ledger import ledger_for

    span, end = parse_duration(period, "--period"), _until(until)  # before the store opens
    if end is not None and end.year < 1900:  # (and a period back from it may not be a date)
        raise typer.BadParameter(f"{until!r} is before the store's time", param_hint="--until")
    now = datetime.now(timezone.utc)
    if end is not None and end > now:  # its period would hold time nothing can have served
        raise typer.BadParameter(
            f"{until!r} is in the future (now is {now:%Y-%m-%dT%H:%M:%S} UTC): the ledger "
            f"accounts for what has happened; give a time up to now, or leave --until out "
            f"for now", param_hint="--until")
    with _errors():
        data = ledger_for(_db(deployment, database_url), deployment=deployment, period=span,
                          until=end)
    if json_out:
        _emit(data)
    else:
        out.print(ledger_table(data))

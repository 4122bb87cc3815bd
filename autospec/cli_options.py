"""Options that commands of several areas share, declared once so that their names and help
agree: ``--database-url`` (alias ``--url``) on every command that opens the store
(``loadgen``'s ``--url`` is another option, the server it drives: it opens no store), and
``--vllm-option KEY=VALUE``, vLLM's engine arguments (``serve``, ``bench serve``,
``synth``, ``pretrain``), parsed and checked the same way everywhere."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from autospec.names import name_problem
from autospec.settings import DATABASE_URL_HELP


def _name_check(what: str) -> Callable[[str | None], str | None]:
    """A Typer callback refusing a ``what`` the store would not take (exit 2 naming the
    option), before a store is opened or a model loaded."""

    def check(value: str | None) -> str | None:
        problem = None if value is None else name_problem(what, value)
        if problem:
            raise typer.BadParameter(problem)
        return value

    return check


deployment_name = _name_check("deployment")
segment_name = _name_check("segment")

DatabaseUrl = Annotated[str | None, typer.Option("--database-url", "--url",
                                                 help=DATABASE_URL_HELP)]


def engine_options(pairs: list[str], option: str = "--vllm-option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a dict (each VALUE parsed as JSON when it is JSON)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{option} {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def check_engine_options(options: dict[str, Any], managed: dict[str, str] | None = None) -> None:
    """Refuse, before anything starts, a ``--vllm-option`` vLLM's engine does not take (a
    replica would fail to start with it, and Serve retry it) or one autospec sets: those of
    a serving engine (``MANAGED_ARGS``), or ``managed`` (key: what sets it) for a command
    whose engine autospec sets up otherwise."""
    if not options:
        return
    from autospec.engine.vllm.engine import (
        MANAGED_ARGS,
        engine_option_refusal,
        managed_option_refusal,
    )

    managed = MANAGED_ARGS if managed is None else managed
    why = managed_option_refusal(options, managed)  # needs no vLLM
    if why is None:
        try:
            why = engine_option_refusal(options, managed)
        except ImportError:
            raise typer.BadParameter("--vllm-option needs vLLM installed (`--engine vllm`)") \
                from None
    if why is not None:
        raise typer.BadParameter(why, param_hint="--vllm-option")

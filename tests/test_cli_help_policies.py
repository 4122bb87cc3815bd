"""The figures an option's help quotes from the shipped policies are theirs (``train
--heldout-fraction`` said 0.2 "in the shipped policies", conservative's is 0.25;
``evaluate --speed-repeats`` / ``--speed-max-tokens`` gave the default policy's 2 and 32 as if
every policy had them; found by a CLI audit)."""

from __future__ import annotations

import typer

from autospec.cli import app
from autospec.controller.policy import load_policy


def _help(command: str, name: str) -> str:
    option = [p for p in typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
              if p.name == name]
    return option[0].help


def test_helps_quote_the_shipped_policies_values_and_name_the_policy() -> None:
    default, conservative = load_policy("default"), load_policy("conservative")
    assert (f"window.heldout_fraction: {default.window.heldout_fraction:g} in the shipped "
            f"default, {conservative.window.heldout_fraction:g} in conservative"
            in _help("train", "heldout_fraction"))
    speed = default.evaluation.speed
    assert f"{speed.repeats} in the shipped default" in _help("evaluate", "speed_repeats")
    assert f"{speed.max_tokens} in the shipped default" in _help("evaluate", "speed_max_tokens")
    assert f"{speed.prompts} in the shipped default" in _help("evaluate", "speed_prompts")

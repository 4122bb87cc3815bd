"""`autospec bench train`'s options and :class:`TrainBenchRequest`'s fields cannot drift
apart: one option per field (same name, default, help and bounds), and the command fills
every field from its option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from annotated_types import Ge, Le
from typer.testing import CliRunner

from autospec.bench.train_request import TrainBenchRequest
from autospec.cli import app


def _train_options() -> dict[str, Any]:
    """The command's options by parameter name (Typer's click objects)."""
    group: Any = typer.main.get_command(app)
    command = group.commands["bench"].commands["train"]
    return {p.name: p for p in command.params if p.param_type_name == "option"}


def _option_default(value: Any) -> Any:
    """A field's default as its option spells it (lists as comma lists)."""
    return ",".join(value) if isinstance(value, tuple) else value


def test_every_field_has_its_option_and_every_option_its_field() -> None:
    options = _train_options()
    fields = TrainBenchRequest.model_fields
    assert set(options) == set(fields)
    for name, field in fields.items():
        option = options[name]
        assert option.default == _option_default(field.default), name
        assert option.help == field.description, name
        bounds = {type(m): m for m in field.metadata}
        low, high = option.min, option.max
        assert low == (bounds[Ge].ge if Ge in bounds else None), name
        assert high == (bounds[Le].le if Le in bounds else None), name


def test_the_command_fills_every_field(monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    seen: list[TrainBenchRequest] = []
    monkeypatch.setattr("autospec.bench.train.run_train_bench", seen.append)
    (tmp_path / "model").mkdir()  # --target and --base must name directories that exist
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "b").mkdir()
    values = {"target": str(tmp_path / "model"), "domain": "coding", "requests": 40,
              "max_new_tokens": 16,
              "kinds": ("eagle3", "suffix"), "k": 3, "epochs": 2, "eval_requests": 4,
              "draft_vocab_size": 64, "ttt_steps": 2, "dtype": "float32", "draft_epochs": 1,
              "feature_noise": 0.0, "heldout_fraction": 0.25, "seed": 7,
              "workdir": tmp_path / "w", "reuse": True, "variants": ("synthetic", "scratch"),
              "synthetic_share": 0.5, "synthetic_count": 8, "base": tmp_path / "b",
              "other_domain": "json", "json_path": tmp_path / "out.json"}
    assert set(values) == set(TrainBenchRequest.model_fields)
    args = ["bench", "train"]
    for name, value in values.items():
        option = "--json" if name == "json_path" else "--" + name.replace("_", "-")
        if value is True:
            args.append(option)
        else:
            args += [option, _option_default(value) if isinstance(value, tuple) else str(value)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen and seen[0].model_dump() == values
    assert all(values[n] != _option_default(f.default) for n, f in
               TrainBenchRequest.model_fields.items())  # each option made a difference


def test_a_bad_field_is_named_by_its_option() -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--heldout-fraction", "1.5"])
    assert result.exit_code == 2
    assert "--heldout-fraction: Input should be less than 1" in " ".join(
        result.output.replace("│", " ").split())


def test_the_request_takes_comma_lists_and_checks_before_anything_loads() -> None:
    request = TrainBenchRequest(kinds="eagle3, suffix", variants="scratch,base")
    assert request.kinds == ("eagle3", "suffix") and request.variants == ("scratch", "base")
    with pytest.raises(ValueError, match="add eagle3 to --kinds"):
        TrainBenchRequest(kinds="suffix", variants="base")

"""The demo's plan and policy per serving engine (nothing runs)."""

from __future__ import annotations

from typer.testing import CliRunner

from autospec.cli import app
from autospec.demo.plan import demo_policy, plan_for


def test_a_demo_on_vllm_trains_what_vllm_serves_and_its_policy_says_so() -> None:
    plan = plan_for("full").on_engine("vllm")
    assert plan.engine == "vllm" and plan.kinds == ("suffix", "eagle3")
    policy = demo_policy(plan)
    assert policy.training.engine == "vllm" and policy.training.kinds == ["suffix", "eagle3"]
    assert policy.training.overrides("eagle3") == {"tree_nodes": 0, "suffix_threshold": None}
    native = plan_for("full").on_engine("native")
    assert native.kinds == ("suffix", "eagle3")
    assert demo_policy(native).training.engine == "native"


def test_an_unknown_engine_is_refused_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = CliRunner().invoke(app, ["demo", "--engine", "tgi", "--out", str(tmp_path / "o")])
    assert done.exit_code == 2 and "--engine must be auto, native or vllm" in done.output
    assert not (tmp_path / "o").exists()

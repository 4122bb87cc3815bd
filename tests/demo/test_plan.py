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


def test_an_out_that_is_a_file_is_refused_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It had been a FileExistsError traceback once the checks passed (a target that does
    not exist would be refused first: the refusal must come before the target's)."""
    (tmp_path / "t.sh").write_text("echo hi\n")
    for out in (tmp_path / "t.sh", tmp_path / "t.sh" / "report"):
        done = CliRunner().invoke(app, ["demo", "--quick", "--target", str(tmp_path / "nope"),
                                        "--out", str(out)])
        assert done.exit_code == 2, done.output
        # the panel wraps a long path anywhere: compared with no spaces at all
        text = "".join(done.output.replace("│", " ").split())
        want = f"'--out': {tmp_path / 't.sh'} is a file; --out names the report's directory"
        assert "".join(want.split()) in text and "Traceback" not in done.output
    assert (tmp_path / "t.sh").read_text() == "echo hi\n"


def test_domains_that_are_one_domain_under_an_alias_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = CliRunner().invoke(app, ["demo", "--domain-a", "json", "--domain-b", "extraction",
                                    "--target", str(tmp_path / "nope"), "--out",
                                    str(tmp_path / "o")])
    assert done.exit_code == 2, done.output
    text = " ".join(done.output.replace("│", " ").split())
    assert "--domain-a and --domain-b must differ (json, extraction: both json)" in text
    assert not (tmp_path / "o").exists()

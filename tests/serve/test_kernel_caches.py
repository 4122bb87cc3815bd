"""The kernel-cache bounds each replica's Ray options carry (no Ray, no model)."""

from __future__ import annotations

from autospec.serve.app import deployment_options
from autospec.serve.config import ServeConfig
from autospec.serve.kernel_caches import CACHE_VARS, with_kernel_cache_env


def test_both_bounds_are_added_beside_the_operators_own_variables() -> None:
    given = {"num_cpus": 1, "runtime_env": {"env_vars": {"AUTOSPEC_DATA_DIR": "/d"}}}
    options = with_kernel_cache_env(given, 64, environ={})
    assert options["runtime_env"]["env_vars"] == {
        "AUTOSPEC_DATA_DIR": "/d", "LRU_CACHE_CAPACITY": "64",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert given["runtime_env"]["env_vars"] == {"AUTOSPEC_DATA_DIR": "/d"}  # not mutated


def test_a_value_the_operator_set_is_kept() -> None:
    given = {"runtime_env": {"env_vars": {"LRU_CACHE_CAPACITY": "512"}}}
    options = with_kernel_cache_env(given, 64, environ={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"})
    assert options["runtime_env"]["env_vars"] == {"LRU_CACHE_CAPACITY": "512"}


def test_none_leaves_the_libraries_defaults() -> None:
    assert with_kernel_cache_env({"num_cpus": 1}, None, environ={}) == {"num_cpus": 1}


def test_the_deployment_carries_the_bounds_by_default(monkeypatch) -> None:
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    options = deployment_options(ServeConfig())["ray_actor_options"]
    assert {v: options["runtime_env"]["env_vars"][v] for v in CACHE_VARS} == {
        v: "64" for v in CACHE_VARS}
    off = deployment_options(ServeConfig(kernel_cache_entries=None))["ray_actor_options"]
    assert "runtime_env" not in off

"""``vllm_options`` in a Serve config file are checked as ``--vllm-option`` is (the Ray Serve
app validates the file with :func:`~autospec.serve.config.checked_config`), and none of them
replaces an engine argument autospec sets itself."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("key, value", [
    ("dtype", "bfloat16"), ("worker_extension_cls", "mine.Extension"),
    ("speculative_config", {"method": "ngram"}), ("model", "/elsewhere"),
])
@pytest.mark.parametrize("engine", ["vllm", "auto"])
def test_a_serve_config_setting_what_autospec_manages_is_refused_naming_it(
        engine, key, value) -> None:
    from autospec.serve.config import ServeConfigError, checked_config

    with pytest.raises(ServeConfigError) as got:
        checked_config({"engine": engine, "api_key": "sk-VERYSECRET",
                        "vllm_options": {"max_model_len": 1024, key: value}})
    text = str(got.value)
    assert f"'{key}' is set by autospec" in text and "vllm-options" in text
    assert "VERYSECR" not in text and "input_value" not in text


def test_an_unknown_engine_argument_in_a_serve_config_is_refused_with_the_closest() -> None:
    pytest.importorskip("vllm")
    from autospec.serve.config import ServeConfigError, checked_config

    with pytest.raises(ServeConfigError, match=r"'max_model_lenn'.*max_model_len"):
        checked_config({"engine": "vllm", "vllm_options": {"max_model_lenn": 1024}})
    assert checked_config({"engine": "vllm", "vllm_options": {"max_model_len": 1024}})
    assert checked_config({"engine": "native", "vllm_options": {"dtype": "bfloat16"}})


def test_options_never_replace_the_engine_arguments_autospec_sets() -> None:
    from autospec.engine.vllm.engine import MANAGED_ARGS, WORKER_EXTENSION, engine_kwargs

    spec = {"method": "ngram", "num_speculative_tokens": 3}
    kwargs = engine_kwargs("/m", dtype="float32", speculative_config=spec, max_model_len=512,
                           options={"dtype": "bfloat16", "worker_extension_cls": "mine.X",
                                    "model": "/other", "speculative_config": None,
                                    "per_request_spec_decode_metrics": "none", "seed": 3,
                                    "max_model_len": 1024})
    assert {key: kwargs[key] for key in MANAGED_ARGS} == {
        "model": "/m", "dtype": "float32", "speculative_config": spec,
        "worker_extension_cls": WORKER_EXTENSION, "per_request_spec_decode_metrics": "summary"}
    assert kwargs["seed"] == 3 and kwargs["max_model_len"] == 1024  # defaults: replaced

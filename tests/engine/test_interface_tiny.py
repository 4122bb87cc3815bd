"""The engine interface (:mod:`autospec.engine.interface`): every engine in
:data:`~autospec.engine.choice.ENGINES` implements it, the one request check, and the one
translation of autospec's sampling settings into vLLM's. docs/architecture.md, "Add a
serving engine", is the checklist these keep true."""

from __future__ import annotations

import importlib

import pytest

from autospec.engine.choice import ENGINE_CHOICES, ENGINES, resolve_engine
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.interface import Engine, RequestError, check_fits, drafting_now
from autospec.engine.sampling import SamplingParams

#: each engine's implementation (module, class): the checklist's step 1
IMPLEMENTATIONS = {"native": ("autospec.engine.generate", "SpeculativeEngine"),
                   "vllm": ("autospec.engine.vllm.engine", "VllmEngine")}
METHODS = ("check_request", "drafted_by", "retire", "close")


def test_every_engine_implements_the_interface():
    from autospec.serve.engines import DEFAULT_DEVICE

    assert set(IMPLEMENTATIONS) == set(ENGINES) == set(DEFAULT_DEVICE)
    for name, (module, cls_name) in IMPLEMENTATIONS.items():
        cls = getattr(importlib.import_module(module), cls_name)  # vLLM itself not imported
        assert cls.name == name
        assert all(callable(getattr(cls, m, None)) for m in METHODS), cls_name
        assert hasattr(cls, "errored")


def test_the_native_engine_is_an_engine(tiny):  # type: ignore[no-untyped-def]
    engine = SpeculativeEngine(tiny, None, version="off")
    assert isinstance(engine, Engine)
    assert engine.loaded == ["off"] and engine.drafted_by(0) == ["off"]
    assert drafting_now(engine) == 0 and not engine.errored
    engine.retire()
    engine.close()


def test_one_request_check_for_every_engine():
    params = SamplingParams(max_new_tokens=10)
    check_fits([1, 2], params, context=20, k=5, where="the target's")
    with pytest.raises(RequestError, match="the prompt is empty"):
        check_fits([], params, context=20, k=5, where="the target's")
    with pytest.raises(RequestError, match="exceeds the engine's context of 15 tokens"):
        check_fits([1] * 6, params, context=20, k=5, where="the engine's")


def test_auto_and_unknown_engines():
    assert ENGINE_CHOICES[0] == "auto" and ENGINE_CHOICES[1:] == ENGINES
    assert resolve_engine("native") == "native"
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        resolve_engine("tgi")


def test_sampling_becomes_vllms_in_one_function():
    pytest.importorskip("vllm")
    from autospec.engine.vllm.sampling import vllm_sampling

    params = SamplingParams(max_new_tokens=7, temperature=0.5, top_k=20, top_p=0.9, seed=3,
                            stop=("###",), ignore_eos=True, logit_bias=((5, 1.5),),
                            presence_penalty=0.25, frequency_penalty=0.5)
    sp = vllm_sampling(params, n=2, logprobs=3, stop_token_ids={9, 2})
    assert (sp.n, sp.temperature, sp.top_k, sp.top_p, sp.seed, sp.max_tokens) == \
        (2, 0.5, 20, 0.9, 3, 7)
    assert sp.stop == ["###"] and sp.ignore_eos and sp.logprobs == 3
    assert sp.logit_bias == {5: 1.5} and sp.stop_token_ids == [2, 9]
    assert (sp.presence_penalty, sp.frequency_penalty) == (0.25, 0.5)
    greedy = vllm_sampling(SamplingParams(max_new_tokens=4))
    assert greedy.temperature == 0.0 and greedy.stop_token_ids == [] and not greedy.stop

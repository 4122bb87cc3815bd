"""The pieces around vLLM's OpenAI layer, without an engine: the outputs of a request
gathered whole (streamed deltas included), what replay cannot apply, the settings a row
keeps, the ``autospec`` object added to a stream's last chunk, the refusal of fields vLLM
would ignore, and ``vllm_api_options`` checked by vLLM's own parser. vLLM's request models
and ``SamplingParams`` are real; the engine outputs are plain objects shaped like vLLM's."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from autospec.engine.stats import RequestStats
from autospec.serve.errors import APIError
from autospec.serve.vllm_http import _with_info, parse
from autospec.serve.vllm_openai import (
    Accumulated,
    ApiOptionError,
    api_args,
    autospec_params,
    unreplayable,
    vllm_settings,
)


def _out(index, ids, finish=None, metrics=None, prompt_ids=(1, 2)):
    choice = SimpleNamespace(index=index, token_ids=ids, text="".join(f"<{i}>" for i in ids),
                             finish_reason=finish, spec_decode_metrics=metrics)
    return SimpleNamespace(prompt_token_ids=list(prompt_ids), prompt=None, outputs=[choice],
                           finished=finish is not None)


def test_streamed_deltas_of_two_choices_gather_into_the_whole_request():
    whole = Accumulated(delta=True)
    for out in (_out(0, [5]), _out(1, [7]), _out(0, [6], "length", "m0"),
                _out(1, [8, 9], "stop", "m1")):
        whole.add(out)
    final = whole.final()
    assert final.prompt_token_ids == [1, 2]
    assert [c.token_ids for c in final.outputs] == [[5, 6], [7, 8, 9]]
    assert [c.text for c in final.outputs] == ["<5><6>", "<7><8><9>"]
    assert [c.finish_reason for c in final.outputs] == ["length", "stop"]
    assert [c.spec_decode_metrics for c in final.outputs] == ["m0", "m1"]


def test_cumulative_outputs_are_taken_as_they_come():
    whole = Accumulated(delta=False)
    whole.add(_out(0, [5]))
    whole.add(_out(0, [5, 6], "stop"))
    assert whole.final().outputs[0].token_ids == [5, 6]


def test_what_replay_cannot_apply_is_named_and_the_rest_is_replayable():
    assert unreplayable(SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=3)) == []
    assert unreplayable(SamplingParams(presence_penalty=0.5)) == []  # replay applies it
    assert unreplayable(SamplingParams(repetition_penalty=1.2)) == ["repetition_penalty"]
    schema = StructuredOutputsParams(json={"type": "object"})
    json_schema = SamplingParams(structured_outputs=schema)
    assert unreplayable(json_schema) == ["structured_outputs"]
    assert vllm_settings(json_schema) == {"structured_outputs": {"json": {"type": "object"}}}
    biased = SamplingParams(min_tokens=3, logit_bias={5: -1.0})
    assert unreplayable(biased) == ["min_tokens"]  # replay applies the bias itself
    assert autospec_params(biased).logit_bias == ((5, -1.0),)


def test_a_greedy_request_replays_whatever_masked_its_logits():
    greedy = SamplingParams(temperature=0, presence_penalty=0.5, min_tokens=2,
                            structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    assert unreplayable(greedy) == []
    assert set(vllm_settings(greedy)) == {"min_tokens", "structured_outputs"}
    assert autospec_params(greedy).presence_penalty == 0.5  # the row's own key: replay reads it


def test_a_rows_settings_are_autospecs_and_only_vllms_non_defaults():
    sp = SamplingParams(max_tokens=9, temperature=0.5, top_k=-1, seed=5, stop=["x"],
                        frequency_penalty=0.25, stop_token_ids=[7])
    params = autospec_params(sp)
    assert (params.max_new_tokens, params.temperature, params.top_k, params.seed) == \
        (9, 0.5, 0, 5)
    assert params.stop == ("x",)
    assert params.frequency_penalty == 0.25  # autospec's own setting, in the row's own keys
    assert vllm_settings(sp) == {"stop_token_ids": [7]}


def test_the_autospec_object_goes_into_the_last_chunk_before_done():
    def event(data):
        return f"data: {json.dumps(data)}\n\n"

    events = [event({"choices": [{"index": 0, "delta": {"content": "a"},
                                  "finish_reason": None}]}),
              event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
              event({"choices": [], "usage": {"completion_tokens": 2}}),
              "data: [DONE]\n\n"]
    stats = RequestStats(num_drafts=2, num_accepted_tokens=1, num_draft_tokens=3,
                         accepted_per_position=[1, 0, 0])
    served = SimpleNamespace(version=SimpleNamespace(name="v1"), result=SimpleNamespace(
        stats=stats), extra=[], drafted_by=[])
    binding = SimpleNamespace(served=served)

    async def source():
        for e in events:
            yield e

    async def run():
        return [e async for e in _with_info(source(), binding)]

    out = asyncio.run(run())
    assert len(out) == 4 and out[-1] == "data: [DONE]\n\n"
    assert [("autospec" in json.loads(e[6:])) for e in out[:3]] == [False, False, True]
    assert json.loads(out[2][6:])["autospec"]["version"] == "v1"
    assert json.loads(out[2][6:])["usage"] == {"completion_tokens": 2}


def test_a_field_vllm_would_ignore_is_a_400_naming_it():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert parse(body, ChatCompletionRequest).max_tokens == 3
    with pytest.raises(APIError) as refused:
        parse({**body, "temprature": 0.1}, ChatCompletionRequest)
    assert refused.value.status == 400 and refused.value.param == "temprature"
    assert parse({**body, "use_beam_search": True}, ChatCompletionRequest).use_beam_search
    invalid = parse({**body, "max_tokens": "many"}, ChatCompletionRequest)
    assert invalid.errors()[0]["loc"] == ("max_tokens",)  # vLLM's handler answers it


def test_vllm_api_options_are_checked_by_vllms_parser(tmp_path):
    args = api_args(str(tmp_path), "m", {"tool_call_parser": "hermes",
                                         "enable_auto_tool_choice": True})
    assert args.tool_call_parser == "hermes" and args.enable_auto_tool_choice
    assert args.served_model_name == ["m"]
    with pytest.raises(ApiOptionError, match="'tool_parser' is not an option"):
        api_args(str(tmp_path), "m", {"tool_parser": "hermes"})
    assert RequestOutputKind.DELTA.name == "DELTA"  # what Accumulated reads a stream by


def test_vllms_handlers_are_rebuilt_over_each_new_engine(monkeypatch):
    from autospec.serve import vllm_openai
    from autospec.serve.vllm_http import VllmLayer

    built = []

    async def build(server, args):  # stands in for vLLM's init_app_state
        built.append(server.versions.current.engine)
        return f"api over {server.versions.current.engine}"

    monkeypatch.setattr(vllm_openai.VllmApi, "build", staticmethod(build))
    server = SimpleNamespace(versions=SimpleNamespace(current=SimpleNamespace(engine="e1")))

    async def run():
        layer = VllmLayer(server, None)  # type: ignore[arg-type]  # the versions are all it reads
        first = await layer.openai_api()
        again = await layer.openai_api()  # same engine (an in-place swap): kept
        server.versions.current.engine = "e2"  # a side-by-side swap: a new engine
        return first, again, await layer.openai_api()

    assert asyncio.run(run()) == ("api over e1", "api over e1", "api over e2")
    assert built == ["e1", "e2"]


def test_the_first_token_time_is_vllms_own_when_only_the_final_output_comes():
    """A request that does not stream gets one output, at its end: the time it reached us
    is no TTFT. vLLM's record (``metrics``: its arrival, wall clock, and first-token
    latency from there) gives the first token's time, never later than the output's."""
    import time

    from autospec.engine.vllm.stats import first_token_s

    arrived = time.perf_counter() - 2.0  # autospec admitted it 2 s ago
    final = SimpleNamespace(metrics=SimpleNamespace(arrival_time=time.time() - 1.9,
                                                    first_token_latency=0.4))
    assert first_token_s(final, arrived, observed=2.0) == pytest.approx(0.5, abs=0.05)
    assert first_token_s(SimpleNamespace(metrics=None), arrived, observed=2.0) == 2.0
    zero = SimpleNamespace(metrics=SimpleNamespace(arrival_time=0.0, first_token_latency=0.0))
    assert first_token_s(zero, arrived, observed=2.0) == 2.0  # stats logging off
    late = SimpleNamespace(metrics=SimpleNamespace(arrival_time=time.time(),
                                                   first_token_latency=5.0))
    assert first_token_s(late, arrived, observed=0.3) == 0.3  # a streamed first output


def test_a_request_is_named_from_the_version_it_was_bound_to_not_its_first_step():
    """A stream's ``x-autospec-speculator`` header goes out with the version the request was
    bound to, before its first step; a version loaded in place between the two must not
    leave the row and the ``autospec`` object naming only the newer one."""
    from autospec.serve.vllm_openai import Binding, EngineProxy

    class Engine:
        def __init__(self) -> None:
            self.loaded = ["head-a"]

        async def generate_raw(self, *args, **kwargs):
            yield _out(0, [5, 6], "length")

    engine = Engine()
    reported = []
    server = SimpleNamespace(
        report_vllm=lambda binding, output, sp, ttft, first: reported.append(first),
        metrics=None)
    binding = Binding(SimpleNamespace(arrived=0.0), None,
                      SimpleNamespace(engine=engine, slot=None))
    engine.loaded.append("head-b")  # loaded in place after the bind, before the first step

    async def run():
        return [o async for o in EngineProxy(server)._generate(
            binding, "p", SamplingParams(max_tokens=2), "r1", {})]

    assert len(asyncio.run(run())) == 1
    assert reported == [0]  # the versions from head-a on: both are named

"""vLLM's own OpenAI serving layer, with autospec's hooks, for ``engine: vllm`` replicas.

A replica on vLLM answers ``/v1/chat/completions`` and ``/v1/completions`` with vLLM's
``OpenAIServingChat`` and ``OpenAIServingCompletion``, built by vLLM's ``init_app_state``
exactly as ``vllm serve`` builds them, so every field vLLM's server takes is taken here
(``response_format``, structured outputs, ``tools`` / ``tool_choice``, penalties,
``logit_bias``, ``n`` and ``logprobs`` when streaming, ``seed``...) with vLLM's answers and
errors. Options of vLLM's server (``--tool-call-parser``, ``--enable-auto-tool-choice``,
``--chat-template``...) come from the deployment's ``vllm_api_options``.

What autospec adds lives in :class:`EngineProxy`, the engine client vLLM's layer is given:
it hands each request to the engine of the version the request was bound to when admitted
(:class:`Binding`), watches its outputs and, when it finishes, writes the traffic row
(prompt and output ids as vLLM decoded them, every sampling setting, vLLM's acceptance) and
the metrics through :class:`~autospec.serve.vllm_http.VllmLayer`, the collaborator a vLLM
replica's server holds (``server.api``): admission through the server, vLLM's handlers
rebuilt over each new engine, the routes. The HTTP side (:mod:`autospec.serve.vllm_http`)
adds admission, the version header, the ``autospec`` object and the refusal of fields vLLM
would ignore.

Sampling settings beyond autospec's own (``repetition_penalty``, structured outputs,
``min_p``, ``min_tokens``, stop token ids...) are recorded with the row under
``sampling.vllm``. A greedy request replays exactly whatever they were (:func:`unreplayable`
says why); a sampled one under settings replay does not apply is named in
``sampling.unreplayable``, and shadow evaluation leaves those rows out and says how many
(:func:`autospec.evaluate.run.replayable`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from autospec.engine.interface import drafting_now
from autospec.engine.sampling import SamplingParams
from autospec.engine.vllm.stats import first_token_s
from autospec.serve.requests import Job, RequestContext
from autospec.serve.versions import ServedVersion

log = logging.getLogger(__name__)

#: temperatures below this decode greedily (as vLLM and autospec's engine read them)
_GREEDY_BELOW = 1e-5

_BINDING: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "autospec_vllm_binding", default=None)


class Replica(Protocol):
    """What vLLM's layer needs of the replica (:class:`~autospec.serve.vllm_http.VllmLayer`
    provides it): its versions
    and metrics, admission, and the traffic row."""

    versions: Any
    metrics: Any
    config: Any
    model_name: str
    api_args: Any

    def bind(self, ctx: RequestContext) -> Binding: ...

    def release(self, binding: Binding) -> None: ...

    def report_vllm(self, binding: Binding, output: Any, sampling_params: Any, ttft_s: float,
                    first: int) -> Any: ...

    async def openai_api(self) -> VllmApi: ...


class ApiOptionError(ValueError):
    """A ``vllm_api_options`` entry vLLM's server does not take."""


@dataclass
class Binding:
    """One admitted request: where it came from, its place in the replica's load, the
    version it was bound to, and (once finished) what it served."""

    ctx: RequestContext
    job: Job
    version: ServedVersion
    served: Any = None  # the finished request (:class:`~autospec.serve.requests.Served`)
    released: bool = False
    #: its engine calls write no traffic row (beam search: one-token calls, nothing drafted)
    unlogged: bool = False
    #: the position in its engine's ``loaded`` when it was bound: it is named after the
    #: versions loaded from there on, as its stream's header (sent before the first step)
    #: names the version it was bound to
    first: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.first = drafting_now(self.version.engine)

    def __enter__(self) -> Binding:
        self._token = _BINDING.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _BINDING.reset(self._token)


class EngineProxy:
    """The ``EngineClient`` vLLM's serving layer calls: the replica's current vLLM engine for
    everything but :meth:`generate`, which decodes a request on the engine of the version it
    is bound to and reports it when it finishes."""

    def __init__(self, server: Replica) -> None:
        self._server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server.versions.current.engine.llm, name)

    def generate(self, prompt: Any, sampling_params: Any, request_id: str,
                 **kwargs: Any) -> AsyncIterator[Any]:
        binding = _BINDING.get()  # read now: vLLM iterates the stream in another task
        if binding is None:
            raise RuntimeError("a vLLM request outside autospec's admission")
        return self._generate(binding, prompt, sampling_params, request_id, kwargs)

    async def _generate(self, binding: Binding, prompt: Any, sampling_params: Any,
                        request_id: str, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        engine, first = binding.version.engine, binding.first
        whole, ttft, done = Accumulated(_is_delta(sampling_params)), 0.0, False
        try:
            async for output in engine.generate_raw(prompt, sampling_params, request_id,
                                                    slot=binding.version.slot, **kwargs):
                ttft = ttft or time.perf_counter() - binding.ctx.arrived
                whole.add(output)
                done = bool(output.finished)
                if done:  # vLLM's own time of the first token (a final-only output's is late)
                    ttft = first_token_s(output, binding.ctx.arrived, ttft)
                yield output
        except (asyncio.CancelledError, GeneratorExit):  # the client left: vLLM aborts it
            self._server.metrics.abandoned.labels("decoding").inc()
            raise
        if done and not binding.unlogged:
            self._finished(binding, whole.final(), sampling_params, ttft, first)

    def _finished(self, binding: Binding, output: Any, sampling_params: Any, ttft: float,
                  first: int) -> None:
        try:
            binding.served = self._server.report_vllm(binding, output, sampling_params, ttft,
                                                      first)
        except Exception:  # the answer goes out whether or not its row could be written
            log.exception("could not record a vLLM request")


def _is_delta(sampling_params: Any) -> bool:
    """vLLM streams send each step's new tokens only (``RequestOutputKind.DELTA``)."""
    kind = getattr(sampling_params, "output_kind", None)
    return getattr(kind, "name", "") == "DELTA"


@dataclass
class _Choice:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    spec_decode_metrics: Any = None
    logprobs: Any = None


class Accumulated:
    """A request's outputs as vLLM sends them (whole each time, or each step's new tokens
    in a stream), gathered into the finished request: prompt ids, and per choice its token
    ids, text, finish reason and acceptance metrics."""

    def __init__(self, delta: bool) -> None:
        self.delta = delta
        self.prompt_token_ids: list[int] | None = None
        self.prompt: str | None = None
        self.choices: dict[int, _Choice] = {}

    def add(self, output: Any) -> None:
        if output.prompt_token_ids:
            self.prompt_token_ids = list(output.prompt_token_ids)
        if getattr(output, "prompt", None) is not None:
            self.prompt = output.prompt
        for c in output.outputs:
            choice = self.choices.setdefault(c.index, _Choice(c.index))
            if self.delta:
                choice.token_ids += list(c.token_ids)
                choice.text += c.text or ""
            else:
                choice.token_ids, choice.text = list(c.token_ids), c.text or ""
            choice.finish_reason = c.finish_reason or choice.finish_reason
            metrics = getattr(c, "spec_decode_metrics", None)
            choice.spec_decode_metrics = metrics or choice.spec_decode_metrics

    def final(self) -> Any:
        """The finished request in the shape of vLLM's ``RequestOutput``."""
        from types import SimpleNamespace

        return SimpleNamespace(prompt_token_ids=self.prompt_token_ids, prompt=self.prompt,
                               outputs=sorted(self.choices.values(), key=lambda c: c.index),
                               finished=True)


# -- sampling settings ---------------------------------------------------------------------


def autospec_params(sp: Any) -> SamplingParams:
    """autospec's sampling settings of a vLLM ``SamplingParams`` (what replay applies)."""
    return SamplingParams(
        max_new_tokens=int(sp.max_tokens or 1), temperature=float(sp.temperature),
        top_k=max(0, int(sp.top_k or 0)), top_p=float(sp.top_p),
        seed=None if sp.seed is None else int(sp.seed) % 2**64,
        stop=tuple(sp.stop or ()), ignore_eos=bool(sp.ignore_eos),
        logit_bias=tuple((int(t), float(b)) for t, b in (sp.logit_bias or {}).items()),
        presence_penalty=float(sp.presence_penalty or 0.0),
        frequency_penalty=float(sp.frequency_penalty or 0.0))


def unreplayable(sp: Any) -> list[str]:
    """The reasons a logged request cannot be replayed faithfully (empty: it can): what in a
    vLLM ``SamplingParams`` changes the distribution the target samples from beyond the
    logit bias, presence and frequency penalties, temperature, top-k and top-p, which
    autospec's replay applies.

    A greedy request is always replayable: its logged output is the argmax of the logits
    after every penalty, bias and grammar mask, and replay accepts drafts while they equal
    the logged tokens (vLLM accepts a draft while it equals the masked argmax, and drops
    drafts the grammar refuses, which that argmax never is), so the mask changes nothing
    replay counts. A sampled request's acceptance depends on the processed distribution,
    which replay does not rebuild."""
    if float(sp.temperature) < _GREEDY_BELOW:
        return []
    reasons = []
    if float(sp.repetition_penalty) != 1.0:  # it counts the prompt too: replay does not
        reasons.append("repetition_penalty")
    if getattr(sp, "structured_outputs", None) is not None:
        reasons.append("structured_outputs")
    if float(getattr(sp, "min_p", 0.0) or 0.0) > 0.0:
        reasons.append("min_p")
    if int(getattr(sp, "min_tokens", 0) or 0) > 0:
        reasons.append("min_tokens")
    if getattr(sp, "allowed_token_ids", None):
        reasons.append("allowed_token_ids")
    if getattr(sp, "bad_words", None):
        reasons.append("bad_words")
    if getattr(sp, "logits_processors", None):
        reasons.append("logits_processors")
    return reasons


#: settings of vLLM's ``SamplingParams`` a traffic row keeps when they are not the default
_DEFAULTS: dict[str, Any] = {  # (the presence and frequency penalties: autospec's own)
    "repetition_penalty": 1.0, "min_p": 0.0,
    "min_tokens": 0, "stop_token_ids": [], "allowed_token_ids": None, "bad_words": [],
    "include_stop_str_in_output": False, "skip_special_tokens": True,
}


def vllm_settings(sp: Any) -> dict[str, Any]:
    """The settings of a vLLM ``SamplingParams`` beyond autospec's own, as JSON (for the
    traffic row: what the request was decoded under)."""
    out: dict[str, Any] = {}
    for name, default in _DEFAULTS.items():
        value = getattr(sp, name, default)
        if value != default and value is not None:
            out[name] = list(value) if isinstance(value, (list, tuple, set)) else value
    constraint = getattr(sp, "structured_outputs", None)
    if constraint is not None:
        out["structured_outputs"] = _constraint(constraint)
    return out


def _constraint(so: Any) -> dict[str, Any]:
    """A structured-outputs constraint as JSON (json schema, regex, choice, grammar...)."""
    fields = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
    out = {}
    for name in fields:
        value = getattr(so, name, None)
        if value not in (None, False):
            out[name] = value
    return out


# -- building vLLM's layer -----------------------------------------------------------------


def api_args(model_dir: str, served_model_name: str,
             options: dict[str, Any]) -> argparse.Namespace:
    """vLLM's ``serve`` arguments for ``model_dir`` with ``options`` (flag names with
    ``_`` or ``-``; ``true`` for a bare flag), parsed by vLLM's own parser."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="autospec vllm_api_options"))
    argv = ["--model", model_dir, "--served-model-name", served_model_name]
    known = {a.dest for a in parser._actions}
    for key, value in options.items():
        dest = key.replace("-", "_")
        if dest not in known:
            raise ApiOptionError(f"vllm_api_options: {key!r} is not an option of vLLM's "
                                 "server (see `vllm serve --help`)")
        flag = "--" + dest.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, value if isinstance(value, str) else _json(value)]
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports and exits; say what was refused
        raise ApiOptionError(f"vllm_api_options {options}: vLLM's server refused them "
                             f"(exit {exc.code}; see the log above)") from None


def chat_content_format(chat: Any, req: Any) -> str | None:
    """How the chat template vLLM's ``chat`` handler renders ``req`` with takes message
    content: ``"openai"`` (a list of parts, each part's keys passed through) or ``"string"``
    — vLLM's own resolution (the server's ``--chat-template-content-format``, else detected
    from the request's or the server's template); None for a renderer other than vLLM's
    Hugging Face one (a model-specific renderer fixes its own)."""
    from vllm.renderers.hf import HfRenderer, resolve_chat_template_content_format

    online = chat.online_renderer
    renderer = online.renderer
    if not isinstance(renderer, HfRenderer):
        return None
    params = req.build_chat_params(online.chat_template, online.chat_template_content_format)
    tools = None if not req.tools else [tool.model_dump() for tool in req.tools]
    return resolve_chat_template_content_format(
        chat_template=params.chat_template, tools=tools,
        given_format=params.chat_template_content_format, tokenizer=renderer.get_tokenizer(),
        model_config=renderer.model_config)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


@dataclass
class VllmApi:
    """vLLM's chat and completion handlers, served by :class:`EngineProxy`."""

    chat: Any
    completion: Any
    proxy: EngineProxy

    @classmethod
    async def build(cls, server: Replica, args: argparse.Namespace) -> VllmApi:
        """vLLM's handlers for ``server`` (vLLM's ``init_app_state``, on the loop that will
        serve them)."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        proxy = EngineProxy(server)
        state = State()
        await init_app_state(proxy, state, args, supported_tasks=("generate",))
        return cls(chat=state.openai_serving_chat, completion=state.openai_serving_completion,
                   proxy=proxy)

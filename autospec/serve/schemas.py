"""OpenAI-compatible API schemas (requests and responses), separate from engine and tables.

This is the native engine's layer (a vLLM replica answers with vLLM's own,
:mod:`autospec.serve.vllm_http`). No field is ignored: one it does not declare is a 400 naming
it (saying so when the vLLM engine serves it), and fields declared for OpenAI's sake whose
non-default value would change the answer (``echo``, ``best_of``, ``tools``) are
refused with a 400 naming them. ``logit_bias`` and the presence and frequency penalties are
applied to the target's logits at every verified position (the penalties counting the drafts
before it), so decoding stays lossless. ``n > 1`` and ``logprobs`` are parsed here
and served by the vLLM engine; the native engine refuses them with a 400 (the server decides,
:meth:`autospec.serve.server.LLMServer.check_features`), as does a streamed request that asks
for them. Numbers and booleans are strict:
``true`` is not the number 1 and ``"yes"`` is not a boolean (a 400 names the field); a
``null`` means the field's default (``max_tokens``: 16 on completions, as OpenAI; on chat the
server's ``default_max_tokens`` within the context). Extensions, as in vLLM:
``top_k`` and ``ignore_eos``. Every response carries an ``autospec`` object: the speculator
version that served it and its acceptance figures (τ as defined in
:mod:`autospec.engine.stats`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autospec.engine.stats import RequestStats
from autospec.serve.errors import APIError

MAX_STOP_STRINGS = 4
#: most choices per request (``n``)
MAX_CHOICES = 8
#: most alternatives per token: completions' ``logprobs`` (OpenAI: 5), chat's ``top_logprobs``
MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS = 5, 20
#: ``max_tokens`` of a completion that omits it or sends null (OpenAI's default)
DEFAULT_COMPLETION_MAX_TOKENS = 16
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1


#: fields of OpenAI's and vLLM's chat and completion requests that the vLLM engine serves and
#: this (native) layer does not declare, per route (a test checks vLLM's request model for
#: the route takes each)
_VLLM_BOTH = frozenset({
    "response_format", "repetition_penalty", "min_p", "min_tokens", "stop_token_ids",
    "structured_outputs", "echo", "prompt_logprobs", "include_stop_str_in_output",
    "skip_special_tokens", "bad_words", "allowed_token_ids", "priority", "request_id",
    "truncate_prompt_tokens", "length_penalty", "add_special_tokens",
    "return_tokens_as_token_ids", "spaces_between_special_tokens", "use_beam_search",
})
VLLM_FIELDS = {
    "chat": _VLLM_BOTH | {"tools", "tool_choice", "parallel_tool_calls", "chat_template",
                          "chat_template_kwargs", "add_generation_prompt",
                          "continue_final_message", "documents", "reasoning_effort"},
    "completions": _VLLM_BOTH | {"suffix"},
}


def known_fields(model: type[BaseModel]) -> set[str]:
    """The body fields a request ``model`` declares (names and aliases)."""
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
    return names


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    route: ClassVar[str] = "chat"  # which of vLLM's request models a refusal's hint reads

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        """A field this layer does not declare is a 400 naming it, never ignored; one the
        vLLM engine serves says so."""
        if not isinstance(data, dict):
            return data
        unknown = sorted(set(data) - known_fields(cls))
        if unknown:
            name = unknown[0]
            if name in VLLM_FIELDS[cls.route]:
                raise APIError(400, f"{name}: the native engine does not serve it; `autospec "
                               "serve --engine vllm` does", param=name, code="unsupported_field")
            raise APIError(400, f"{name}: no such field", param=name, code="unknown_field")
        return data

    model: str | None = Field(None, description="the served model id (default: the served one)")
    temperature: StrictFloat = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt = Field(-1, ge=-1, description="extension: keep the k likeliest (-1/0: off)")
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(None, ge=_SEED_MIN, le=_SEED_MAX)
    n: StrictInt = Field(1, ge=1, le=MAX_CHOICES,
                         description="choices to generate (engine vllm; the native engine: 1)")
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = Field(
        None, description="include_usage: true sends usage in the last chunk of a stream")
    ignore_eos: StrictBool = Field(False, description="extension: decode past EOS")
    presence_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict[str, Any] | None = None
    user: str | None = Field(None, description="the end user's id: kept in the traffic row "
                             "(not when opted out) and matched by segment rules")

    @field_validator("temperature", "top_p", "top_k", "n", "stream", "ignore_eos",
                     "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """An explicit ``null`` means the documented default, as OpenAI's API reads it."""
        if value is None:
            return cls.model_fields[info.field_name].default  # type: ignore[index]
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(value or {}) - {"include_usage"})
        if unknown:
            raise ValueError(f"{unknown[0]!r}: the native engine streams usage in the last "
                             "chunk only (include_usage); `autospec serve --engine vllm` "
                             "takes vLLM's stream options")
        if value and not isinstance(value.get("include_usage", False), bool | None):
            raise ValueError("include_usage: must be a boolean")
        return value

    @property
    def include_usage(self) -> bool:
        """A stream's last chunk carries usage (``stream_options.include_usage``)."""
        return bool((self.stream_options or {}).get("include_usage"))

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if value == "" or (isinstance(value, list) and "" in value):  # as vLLM refuses it
            raise ValueError("stop cannot contain an empty string")
        return value

    @model_validator(mode="after")
    def _unsupported(self) -> _Request:
        if self.stream_options and not self.stream:  # as vLLM: an empty one asks for nothing
            raise APIError(400, "stream_options: only allowed when stream is true",
                           param="stream_options", code="invalid_value")
        if self.stream and (self.n != 1 or self.wanted_logprobs is not None):
            name = "n" if self.n != 1 else "logprobs"
            raise APIError(400, f"{name}: n > 1 and logprobs are not streamed by the native "
                           "engine; `autospec serve --engine vllm` streams them", param=name,
                           code="unsupported_value")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """OpenAI's form: token ids (as strings) to a bias in [-100, 100]."""
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids, got {key!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                    or not -100 <= bias <= 100:
                raise ValueError(f"token {key}: the bias must be a number in [-100, 100]")
        return value

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, bias) pairs."""
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

    @property
    def wanted_logprobs(self) -> int | None:
        """Alternatives per token the client wants (0: the chosen token's only; None: none)."""
        return None

    @property
    def max_tokens_field(self) -> str:
        """The field the request's token limit came from (what an error about it names)."""
        return "max_tokens"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is a string, a one-string list or token ids."""

    route: ClassVar[str] = "completions"

    prompt: str | list[str] | list[StrictInt] = Field(
        ..., description="text, [text] or token ids")
    max_tokens: StrictInt | None = Field(
        DEFAULT_COMPLETION_MAX_TOKENS, description="tokens to generate (OpenAI default 16; "
        "null: the default)")
    logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_COMPLETION_LOGPROBS,
        description="log-probabilities of the chosen and this many likeliest tokens (engine vllm)")
    echo: StrictBool | None = False
    best_of: StrictInt | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _no_boolean_ids(cls, value: Any) -> Any:
        if isinstance(value, list):
            bad = next((i for i, item in enumerate(value) if isinstance(item, bool)), None)
            if bad is not None:
                raise ValueError(f"token ids must be integers, got a boolean at index {bad}")
        return value

    @field_validator("max_tokens", mode="after")
    @classmethod
    def _default_max_tokens(cls, value: int | None) -> int:
        return DEFAULT_COMPLETION_MAX_TOKENS if value is None else value

    @model_validator(mode="after")
    def _completion_only(self) -> CompletionRequest:
        for name in ("echo", "best_of", "suffix"):
            value = getattr(self, name)
            if value and not (name == "best_of" and value == 1):
                hint = "; `autospec serve --engine vllm` serves it" if name == "echo" else ""
                raise APIError(400, f"{name}: not served by the native engine{hint}",
                               param=name, code="unsupported_value")
        if isinstance(self.prompt, list) and not self.prompt:
            raise APIError(400, "prompt: must not be empty", param="prompt",
                           code="invalid_value")
        if isinstance(self.prompt, list) and isinstance(self.prompt[0], str) \
                and len(self.prompt) != 1:
            raise APIError(400, "prompt: a list of several prompts is not supported (send one)",
                           param="prompt", code="unsupported_value")
        return self

    @property
    def wanted_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: StrictInt | None = Field(
        None, description="tokens to generate (null: the server's default_max_tokens, within "
        "the context)")
    max_completion_tokens: StrictInt | None = Field(None, description="alias of max_tokens")
    logprobs: StrictBool | None = Field(
        False, description="log-probability of each chosen token (engine vllm)")
    top_logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS,
        description="and of this many likeliest tokens at each position (needs logprobs)")
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _chat_only(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs true", param="top_logprobs",
                           code="invalid_value")
        if self.tools:
            raise APIError(400, "tools: the native engine does not serve tool calls; "
                           "`autospec serve --engine vllm` does", param="tools",
                           code="unsupported_field")
        return self

    @property
    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def chat(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


# -- responses ----------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AutospecInfo(BaseModel):
    """Which speculator version served the request and how well it drafted."""

    version: str
    tau: float | None = Field(description="acceptance length: mean over steps of accepted + 1 "
                              "(null when the request took no step: one output token)")
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    drafted_by: list[str] = Field(
        default_factory=list, description="every version that drafted for the request, in "
        "order, when a swap into the running engine happened while it decoded (else empty)")

    @classmethod
    def from_stats(cls, version: str, stats: RequestStats,
                   drafted_by: list[str] | None = None) -> AutospecInfo:
        return cls(version=version, tau=stats.tau, num_drafts=stats.num_drafts,
                   num_draft_tokens=stats.num_draft_tokens,
                   num_accepted_tokens=stats.num_accepted_tokens,
                   accepted_per_position=list(stats.accepted_per_position),
                   drafted_by=list(drafted_by or []))


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions ``logprobs``: one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    autospec: AutospecInfo | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """OpenAI's chat ``logprobs``: one entry per generated token."""

    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    autospec: AutospecInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    autospec: AutospecInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "autospec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


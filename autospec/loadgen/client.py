"""One request through the official ``openai`` client, measured.

:class:`Driver` wraps an ``openai.OpenAI`` client pointed at ``<url>/v1`` (no retries, so
every failure is counted) and turns a :class:`~autospec.loadgen.source.Prompt` into a
chat or completion request with the ``x-autospec-segment`` header. It returns a
:class:`Result`: latency, tokens, and the acceptance statistics the server put in the
response's ``autospec`` object (``version``, ``num_drafts``, ``num_accepted_tokens``...),
It sends ``api_key`` (default ``AUTOSPEC_API_KEY``) as the Bearer token. The version is also
read from the ``x-autospec-speculator`` header and the replica that
answered from ``x-autospec-replica``; ``drafted_by`` lists every version that drafted the
request when an in-place swap on vLLM happened while it decoded (the ``autospec`` object's
``drafted_by``; empty when one version drafted).
Errors are returned as results (``ok=False``), never raised: ``error`` is the kind
(exception class and HTTP status, ``BadRequestError 400``), ``error_message`` what the server
said (its error body's ``message``) or, without an answer, what happened to the connection
(``Connection error: [Errno 111] Connection refused``), on one line of at most
:data:`MESSAGE_CHARS` characters.

With ``stream=True`` each request is streamed (``stream_options.include_usage``) and the
result carries the **time to first token** (``ttft_s``: the first chunk with output text),
so a rate can leave prefill and queueing out: :func:`decode_rate`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from autospec.loadgen.source import Prompt

log = logging.getLogger(__name__)

SEGMENT_HEADER = "x-autospec-segment"
VERSION_HEADER = "x-autospec-speculator"
REPLICA_HEADER = "x-autospec-replica"
MESSAGE_CHARS = 200  # an error message is cut to this many characters, on one line


@dataclass
class Result:
    """What one request did; times in seconds, ``start_s`` from the run's start."""

    index: int
    segment: str
    start_s: float
    latency_s: float
    ok: bool
    error: str | None = None  # its kind: "BadRequestError 400", "APIConnectionError"
    error_message: str | None = None  # what the server (or the connection) said, one line
    version: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    tau: float | None = None
    text: str | None = None
    replica: str | None = None  # x-autospec-replica: id=...; app=...; node=...; host=...
    ttft_s: float | None = None  # streamed requests: seconds to the first output text
    #: every version that drafted it when a swap happened mid-request (else empty)
    drafted_by: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Driver:
    """Sends prompts to one OpenAI-compatible endpoint."""

    def __init__(self, url: str, *, model: str | None = None, max_tokens: int = 64,
                 temperature: float = 0.0, timeout_s: float = 300.0,
                 api_key: str | None = None, keep_text: bool = False,
                 stream: bool = False) -> None:
        from openai import OpenAI

        from autospec.settings import api_key as configured_key

        self.url = url.rstrip("/")
        # the key the server requires (AUTOSPEC_API_KEY by default); the client needs one
        key = api_key or configured_key() or "unused"
        self.client = OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0,
                             timeout=timeout_s)
        self.max_tokens, self.temperature, self.keep_text = max_tokens, temperature, keep_text
        self.stream = stream
        self._model = model

    @property
    def model(self) -> str:
        """The model named in requests: as given, else the first one the server lists."""
        if self._model is None:
            models = self.client.models.list().data
            if not models:
                raise RuntimeError(f"{self.url}/v1/models lists no model")
            self._model = models[0].id
        return self._model

    def send(self, prompt: Prompt, *, index: int = 0, start_s: float = 0.0) -> Result:
        """Send one request; never raises for a failed request."""
        import openai

        params = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                  **prompt.overrides}
        headers = {SEGMENT_HEADER: prompt.segment}
        if self.stream:
            params.update(stream=True, stream_options={"include_usage": True})
        started, ttft = time.perf_counter(), None
        try:
            raw, body = self._create(prompt, params, headers)
            if self.stream:
                body, ttft = _collect(body, started)
        except openai.OpenAIError as exc:
            return Result(index, prompt.segment, start_s, time.perf_counter() - started,
                          ok=False, error=_describe(exc), error_message=_message(exc))
        latency = time.perf_counter() - started
        result = _result(index, prompt.segment, start_s, latency, raw.headers, body,
                         self.keep_text)
        result.ttft_s = ttft
        return result

    def _create(self, prompt: Prompt, params: dict[str, Any],
                headers: dict[str, str]) -> tuple[Any, Any]:
        if prompt.messages is not None:
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.model, messages=prompt.messages, extra_headers=headers,
                **params)  # type: ignore[arg-type]
        else:
            raw = self.client.completions.with_raw_response.create(
                model=self.model, prompt=prompt.prompt or "", extra_headers=headers, **params)
        return raw, raw.parse()


class _Streamed:
    """A streamed answer gathered into the fields :func:`_result` reads of a whole one."""

    def __init__(self) -> None:
        self.usage: Any = None
        self.model_extra: dict[str, Any] = {}
        self.choices: list[Any] = []
        self.text: list[str] = []


def _collect(chunks: Any, started: float) -> tuple[_Streamed, float | None]:
    """Read a stream to its end: the gathered answer and the seconds to its first text."""
    out, ttft = _Streamed(), None
    for chunk in chunks:
        out.usage = chunk.usage or out.usage
        out.model_extra.update(chunk.model_extra or {})
        for choice in chunk.choices[:1]:
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None) if delta is not None else choice.text
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - started
                out.text.append(piece)
    out.choices = [_Text("".join(out.text))]
    return out, ttft


@dataclass
class _Text:
    """A gathered choice: ``text``, as a completion's choice has it."""

    text: str


def decode_rate(results: list[Result]) -> float | None:
    """Output tokens per second after each request's first token (prefill and queueing
    left out, as the gate's rounds compare rates), over the ``results`` that have
    ``ttft_s`` (a streamed answer with no text has none); where none has, tokens per
    second of whole requests (requests not streamed)."""
    timed = [r for r in results if r.ttft_s is not None]
    if timed:
        busy = sum(r.latency_s - (r.ttft_s or 0.0) for r in timed)
        tokens = sum(max(r.completion_tokens - 1, 0) for r in timed)
    else:
        busy = sum(r.latency_s for r in results)
        tokens = sum(r.completion_tokens for r in results)
    return tokens / busy if busy > 0 else None


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    return f"{name} {status}" if status is not None else name


def _message(exc: Exception) -> str:
    """The server's message (an OpenAI- or vLLM-shaped error body), else the client's own
    with its cause (what the connection did), on one line of at most MESSAGE_CHARS."""
    body = getattr(exc, "body", None)
    said = body.get("message") if isinstance(body, dict) else body
    if not isinstance(said, str) or not said.strip():
        said = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        cause = exc.__cause__ or exc.__context__
        if cause is not None and str(cause) and str(cause) not in said:
            said = f"{said.rstrip('.')}: {cause}"
    return shorten(said)


def shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` on one line (runs of whitespace made one space), cut to ``limit`` with '…'."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _result(index: int, segment: str, start_s: float, latency: float, headers: Any,
            body: Any, keep_text: bool) -> Result:
    info = (body.model_extra or {}).get("autospec") or {}
    usage = body.usage
    choice = body.choices[0] if body.choices else None
    text = None
    if keep_text and choice is not None:
        text = getattr(getattr(choice, "message", None), "content", None) \
            or getattr(choice, "text", None)
    return Result(
        index=index, segment=segment, start_s=start_s, latency_s=latency, ok=True,
        version=headers.get(VERSION_HEADER) or info.get("version"),
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        num_drafts=int(info.get("num_drafts") or 0),
        num_draft_tokens=int(info.get("num_draft_tokens") or 0),
        num_accepted_tokens=int(info.get("num_accepted_tokens") or 0),
        tau=info.get("tau"), text=text, replica=headers.get(REPLICA_HEADER),
        drafted_by=[str(v) for v in info.get("drafted_by") or []])

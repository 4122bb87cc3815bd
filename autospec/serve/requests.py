"""A request's life on a replica, as data: where it came from (:class:`RequestContext`),
validated and bound to a version (:class:`Prepared`), its place in the replica's queue
(:class:`Job`), streamed (:class:`Streamed`) and finished (:class:`Served`).

The server (:mod:`autospec.serve.server`) makes them, the decoders
(:mod:`autospec.serve.decode`, :mod:`autospec.serve.vllm_decode`) fill them, the HTTP layers
(:mod:`autospec.serve.http`, :mod:`autospec.serve.vllm_http`) answer from them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autospec.engine.generate import GenerationResult
from autospec.engine.sampling import SamplingParams
from autospec.serve.errors import APIError
from autospec.serve.load import Mark
from autospec.serve.versions import ServedVersion


@dataclass
class RequestContext:
    """Where a request came from and what the caller asked about logging."""

    route: str  # "completions" or "chat"
    segment: str
    log_text: bool = True
    user: str | None = None  # the body's ``user`` (OpenAI's end-user id), kept in the row
    arrived: float = field(default_factory=time.perf_counter)


@dataclass
class Prepared:
    """A validated request, tokenized, bound to the version it will be served by."""

    ctx: RequestContext
    prompt_ids: list[int]
    prompt_text: str | None
    params: SamplingParams
    version: ServedVersion
    n: int = 1  # choices (engine vllm)
    logprobs: int | None = None  # alternatives per token wanted (None: no logprobs)
    #: vLLM's OpenAI layer: the settings beyond autospec's, what replay cannot apply and the
    #: logprobs asked (:mod:`autospec.serve.vllm_openai`)
    vllm: dict[str, Any] | None = None
    #: served with speculation off as the ledger's control group (autospec/serve/holdout.py)
    held_out: bool = False


@dataclass(frozen=True)
class PositionLogprobs:
    """One generated token's log-probability and the likeliest alternatives at its place."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Served:
    """A finished request: ``result`` is its (first) choice; ``extra`` the others (n > 1);
    ``logprobs`` one list per choice when the client asked for them."""

    version: ServedVersion
    result: GenerationResult
    latency_s: float
    ttft_s: float
    extra: list[GenerationResult] = field(default_factory=list)
    logprobs: list[list[PositionLogprobs]] | None = None
    #: the versions that drafted, when more than ``version`` did (a swap mid-request)
    drafted_by: list[str] = field(default_factory=list)
    #: mean requests in flight on the replica during this one's life (:mod:`.load`)
    concurrency: float = 1.0
    in_flight: int = 1  # requests in flight when it started decoding (itself included)
    k: int | None = None  # draft tokens per step it was decoded with (None: the engine's)
    #: the engine's own acceptance summary of each choice, as it reported it (vLLM's)
    reported: list[dict[str, Any] | None] = field(default_factory=list)
    index: int = 0  # the choice a traffic row is written for

    @property
    def choices(self) -> list[GenerationResult]:
        return [self.result, *self.extra]


class Job:
    """One admitted request's place on the decode thread: ``waiting`` -> ``running`` ->
    ``done``, or ``abandoned`` (its client left), ``shed`` (it waited past the replica's
    ``max_queue_wait_s``) or ``refused`` (the decoder closed before it got there) while
    waiting. Its admission is released exactly once, by
    whichever path ends it; ``cancel`` is the flag the decode thread reads after each step."""

    def __init__(self) -> None:
        self.state = "waiting"
        self.admitted = time.monotonic()  # when it joined the replica's queue
        self.cancel = threading.Event()
        self.steps = 0  # decode steps completed (read by logs and tests)
        self.mark: Mark | None = None  # where it entered the replica's load
        self.in_flight = 1  # requests in flight when it started decoding (itself included)


class Streamed:
    """A streamed request (an async iterator): iterate it for token-id steps then :class:`Served`;
    :meth:`abandon` frees it whether or not iteration ever started."""

    def __init__(self, steps: AsyncIterator[list[int] | Served],
                 abandon: Callable[[], None]) -> None:
        self._steps, self.abandon = steps, abandon

    def __aiter__(self) -> Streamed:
        return self

    async def __anext__(self) -> list[int] | Served:
        return await anext(self._steps)


class Overloaded(APIError):
    """Declared overload: a 503 in the OpenAI shape with ``Retry-After``, for a request the
    replica refuses without decoding (:meth:`pending_limit`, :meth:`queued_too_long`)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, type="overloaded_error", code="overloaded",
                         headers={"Retry-After": "1"})

    @classmethod
    def pending_limit(cls, limit: int) -> Overloaded:
        return cls(f"server overloaded: {limit} requests already pending on this replica; "
                   "retry shortly")

    @classmethod
    def queued_too_long(cls, waited_s: float, bound_s: float) -> Overloaded:
        return cls(f"server overloaded: the request waited {waited_s:.1f}s in this replica's "
                   f"queue without starting (max_queue_wait_s {bound_s:g}); retry shortly")


def shutting_down() -> APIError:
    """The 503 of a request the replica refuses because it is closing."""
    return APIError(503, "server is shutting down", type="overloaded_error", code="unavailable")


def check_vocab(ids: Iterable[int], vocab: int, param: str) -> None:
    """A 400 naming ``param`` when one of its token ``ids`` is outside the vocabulary."""
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise APIError(400, f"{param}: token id {bad} is outside the vocabulary [0, {vocab})",
                       param=param, code="invalid_value")


def end_user(ctx: RequestContext) -> dict[str, Any]:
    """A traffic row's end-user id, when the request named one (an opted-out row drops it)."""
    return {} if ctx.user is None else {"user": ctx.user}


def shaping(params: SamplingParams) -> dict[str, Any]:
    """A traffic row's logit bias and penalties, when a request set them (replay applies
    them)."""
    out: dict[str, Any] = {}
    if params.logit_bias:
        out["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    if params.presence_penalty:
        out["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        out["frequency_penalty"] = params.frequency_penalty
    return out

"""The serving engine's interface: what the server, the version manager, replay, synthesis
and the benches ask of an engine, whichever decodes.

Two engines implement it: :class:`~autospec.engine.generate.SpeculativeEngine` (``native``:
autospec's loop, one request at a time, synchronous — :meth:`~SpeculativeEngine.generate`
and :meth:`~SpeculativeEngine.stream`) and :class:`~autospec.engine.vllm.engine.VllmEngine`
(``vllm``: vLLM's ``AsyncLLM``, continuous batching, asynchronous —
:meth:`~VllmEngine.generate` yields vLLM's outputs, which
:func:`~autospec.engine.vllm.stats.vllm_stats` turns into per-request stats). How a request
is decoded differs by engine (a thread per replica, or vLLM's loop); what every caller needs
besides is here. :data:`autospec.engine.choice.ENGINES` names them.

**Adding an engine**: docs/architecture.md, "Add a serving engine".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from autospec.engine.sampling import SamplingParams


class RequestError(ValueError):
    """The request cannot be served as asked (too long, empty prompt...)."""


def check_fits(prompt_ids: list[int], params: SamplingParams, *, context: int, k: int,
               where: str) -> None:
    """The one request check of every engine: :class:`RequestError` for an empty prompt, or
    one whose prompt + ``max_new_tokens`` + ``k`` (the last verify may draft ``k`` past the
    end) does not fit ``context`` tokens (``where``: whose context, for the message)."""
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if len(prompt_ids) + params.max_new_tokens + k > context:
        raise RequestError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_new_tokens}) "
            f"exceeds {where} context of {context - k} tokens")


@runtime_checkable
class Engine(Protocol):
    """One version's engine (a version is a speculator, or none, over the replica's target)."""

    #: which engine this is (one of :data:`autospec.engine.choice.ENGINES`)
    name: str
    #: draft tokens per step (0: target only)
    k: int
    #: the versions loaded into this engine, in order (a vLLM engine takes new versions in
    #: place; a native engine is one version's, so this is empty or that one)
    loaded: list[str]

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """:class:`~autospec.engine.interface.RequestError` (a 400) when this engine would
        refuse the request (empty prompt, longer than its context)."""
        ...

    @property
    def errored(self) -> bool:
        """True when the engine can no longer decode (a replica's health says so)."""
        ...

    def drafted_by(self, first: int) -> list[str]:
        """The versions that drafted for a request that started when ``loaded`` had
        ``first + 1`` entries (a vLLM engine can take a version in place mid-request)."""
        ...

    def retire(self) -> None:
        """No new requests come here (a swap moved on): close once the running ones end."""
        ...

    def close(self) -> None:
        """Stop now and free what the engine holds (running requests are aborted)."""
        ...


def drafting_now(engine: Engine) -> int:
    """The position in ``engine.loaded`` of the version drafting now: a request starting now
    is named after the versions loaded from there on (:meth:`Engine.drafted_by`)."""
    return len(engine.loaded) - 1 if engine.loaded else 0

"""Streaming detokenization: token ids in, step by step; text deltas out, never taken back.

Work per token does not grow with the output: a fast tokenizer decodes through ``tokenizers``'
:class:`~tokenizers.decoders.DecodeStream`, any other through :class:`WindowDecoder` (the same
algorithm: re-decode only the last few ids). Both emit nothing for a token that ends inside a
multibyte character until the character is complete, and the deltas add up to
``tokenizer.decode(ids, skip_special_tokens=True)``.

:class:`TextStream` adds stop strings: it holds back the last ``len(longest stop) - 1``
characters (they may start a stop string) and cuts the text before the first stop string.
The module knows nothing of HTTP or of the engine.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

log = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 character


class Decoder(Protocol):
    def step(self, token_id: int) -> str | None:
        """The text ``token_id`` completes, or None while a character is incomplete."""
        ...


class FastDecoder:
    """``tokenizers``' DecodeStream on a fast tokenizer's backend."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        self.stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str | None:
        return self.stream.step(self.backend, token_id)


class WindowDecoder:
    """DecodeStream's algorithm over any tokenizer with ``decode``: decode the ids since the
    last settled prefix, emit what extends that prefix once it ends in a complete character."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []  # from the start of the settled prefix
        self.prefix = ""  # decode of ids[:prefix_len]
        self.prefix_len = 0

    def step(self, token_id: int) -> str | None:
        self.ids.append(token_id)
        text = self._decode(self.ids)
        if len(text) <= len(self.prefix) or text.endswith(_REPLACEMENT):
            return None
        new = text[len(self.prefix):]
        # keep only the ids since the previous prefix: context for the next tokens' spacing
        self.ids = self.ids[self.prefix_len:]
        self.prefix_len = len(self.ids)
        self.prefix = self._decode(self.ids)
        return new

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def incremental_decoder(tokenizer: Any) -> Decoder:
    """The fastest incremental decoder ``tokenizer`` allows."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return FastDecoder(backend)
    return WindowDecoder(tokenizer)


class TextStream:
    """Turns token ids, step by step, into text deltas that never need taking back.

    ``push(ids)`` returns the text that is now certain: complete characters, not within
    ``len(longest stop) - 1`` characters of the end, and before any stop string (after one,
    nothing more). ``finish(final_text)`` returns the rest of the request's final text.
    Without a tokenizer every delta is empty and ``finish`` returns the whole text.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.decoder = incremental_decoder(tokenizer) if tokenizer is not None else None
        self.pending = ""  # decoded, not yet sent (a stop string can only start here)
        self.sent: list[str] = []
        self.stopped = False

    def push(self, ids: list[int]) -> str:
        if self.decoder is None or self.stopped:
            return ""
        for token_id in ids:
            piece = self.decoder.step(token_id)
            if piece:
                self.pending += piece
        cuts = [self.pending.find(s) for s in self.stop if s in self.pending]
        if cuts:
            self.stopped = True
            return self._send(min(cuts))
        return self._send(len(self.pending) - self.hold)

    def finish(self, final_text: str) -> str:
        """The part of ``final_text`` (the request's whole text) not sent yet."""
        sent = "".join(self.sent)
        if not final_text.startswith(sent):  # cannot happen with a consistent tokenizer
            log.warning("streamed text is not a prefix of the final text; rest not sent")
            return ""
        return final_text[len(sent):]

    def _send(self, n: int) -> str:
        if n <= 0:
            return ""
        delta, self.pending = self.pending[:n], self.pending[n:]
        self.sent.append(delta)
        return delta

"""Streaming detokenization with the real SmolLM2 tokenizer: deltas add up to the full decode,
never hold a partial character, stop strings cut across chunks, work per token stays bounded."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from transformers import AutoTokenizer

from autospec.engine.target import _resolve
from autospec.serve.detok import FastDecoder, TextStream, WindowDecoder

TEXTS = [
    "Plain ASCII text, with punctuation: done.",
    "Héllo naïve café — déjà vu, Ærø, Straße.",
    "世界你好，我们今天学习推测解码。日本語のテキストも。",
    "Emoji 🌍🚀 and families 👨‍👩‍👧 with skin tones 👍🏽 and flags 🇫🇷!",
    "Mixed\nlines\tand tabs 🌍 世界 ok\n\n  indented ✓ ∑ ∫ ≠",
]


@pytest.fixture(scope="module")
def tok() -> Any:
    src, _ = _resolve("smollm2-135m")
    return AutoTokenizer.from_pretrained(src)


class SlowOnly:
    """The tokenizer seen through ``decode`` only (no fast backend): the window decoder."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _run(tokenizer: Any, ids: list[int], stop: tuple[str, ...], final: str,
         chunks: list[int]) -> list[str]:
    stream, deltas, at = TextStream(tokenizer, stop), [], 0
    for size in chunks:
        deltas.append(stream.push(ids[at: at + size]))
        at += size
    assert at == len(ids)
    deltas.append(stream.finish(final))
    return deltas


def _chunks(n: int, rng: random.Random) -> list[int]:
    out = []
    while n > 0:
        out.append(min(n, rng.randint(1, 6)))
        n -= out[-1]
    return out


@pytest.mark.parametrize("wrap", [lambda t: t, SlowOnly], ids=["fast", "window"])
def test_deltas_add_up_to_the_full_decode_without_partial_characters(tok, wrap):
    rng = random.Random(0)
    tokenizer = wrap(tok)
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        full = tok.decode(ids, skip_special_tokens=True)
        for chunks in ([1] * len(ids), _chunks(len(ids), rng)):
            deltas = _run(tokenizer, ids, (), full, chunks)
            assert "".join(deltas) == full
            assert not any("\ufffd" in d for d in deltas), deltas
            assert deltas[-1] == ""  # everything was streamed before the end


@pytest.mark.parametrize("wrap", [lambda t: t, SlowOnly], ids=["fast", "window"])
def test_random_token_ids_match_the_full_decode(tok, wrap):
    """Byte-level pieces that split characters anywhere (invalid UTF-8 included)."""
    rng = random.Random(1)
    for _ in range(30):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))]
        full = tok.decode(ids, skip_special_tokens=True)
        deltas = _run(wrap(tok), ids, (), full, _chunks(len(ids), rng))
        assert "".join(deltas) == full


@pytest.mark.parametrize("stop", ["🌍 世", "界 ok", "👨‍👩", "\n\n  ind", "tabs 🌍"])
def test_a_stop_string_spanning_chunks_cuts_the_text(tok, stop):
    ids = tok(TEXTS[3] + TEXTS[4], add_special_tokens=False)["input_ids"]
    full = tok.decode(ids, skip_special_tokens=True)
    assert stop in full
    expected = full[: full.find(stop)]
    for chunks in ([1] * len(ids), [2] * (len(ids) // 2) + [1] * (len(ids) % 2)):
        stream, streamed = TextStream(tok, (stop, "never")), []
        at = 0
        for size in chunks:
            streamed.append(stream.push(ids[at: at + size]))
            at += size
        assert "".join(streamed) == expected  # the cut is exact before finish
        assert stream.finish(expected) == ""
        assert not any("\ufffd" in d for d in streamed)


def test_the_window_decoder_keeps_a_short_window(tok):
    ids = tok(" ".join(TEXTS) * 5, add_special_tokens=False)["input_ids"]
    dec = WindowDecoder(tok)
    longest = 0
    for i in ids:
        dec.step(i)
        longest = max(longest, len(dec.ids))
    assert len(ids) > 400 and longest <= 16


def test_the_fast_tokenizer_uses_decode_stream(tok):
    from autospec.serve.detok import incremental_decoder

    assert isinstance(incremental_decoder(tok), FastDecoder)
    assert isinstance(incremental_decoder(SlowOnly(tok)), WindowDecoder)


class CountingTokenizer:
    """The target's tokenizer, counting the ids passed to ``decode``."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner, self.decoded = tokenizer, 0

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> str:
        self.decoded += len(ids)
        return self.inner.decode(ids, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_long_stream_decodes_in_linear_work_tiny(server, tiny_llm, monkeypatch):
    from fastapi.testclient import TestClient

    from autospec.serve.http import make_app

    counting = CountingTokenizer(tiny_llm.tokenizer)
    monkeypatch.setattr(tiny_llm, "tokenizer", counting)
    n = 300
    body = {"prompt": "Once upon a time", "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with TestClient(make_app(server)) as c:
        r = c.post("/v1/completions", json=body)
    events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["usage"]["completion_tokens"] == n
    # the prompt, the final text and the engine's own checks: a few times n, not n^2 / 2
    assert counting.decoded <= 4 * n, counting.decoded

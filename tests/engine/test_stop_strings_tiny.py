"""Stop strings of any length end generation (finish reason ``stop``), not only short ones.

A tiny random-init target (vocabulary 64) with the default target's real tokenizer: its ids
17..63 are single characters (lower ids are special tokens, not in the text), so a stop
string of 48 characters spans more than 32 tokens.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target, _resolve
from tests.tiny import tiny_target


@pytest.fixture(scope="module")
def target():
    tiny = tiny_target(vocab_size=64, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(_resolve("smollm2-135m")[0])
    return Target(tiny.model, tokenizer, tiny.info)


@pytest.mark.parametrize("length", [8, 48, 120])
def test_stop_string_tiny_random_init_of_any_length_stops(target, length):
    plain = SpeculativeEngine(target).generate(
        [20, 30, 40], SamplingParams(max_new_tokens=200, ignore_eos=True))
    ids, decode = plain.token_ids, target.decode
    stop = plain.text[10 : 10 + length]
    end = next(i for i in range(len(ids) + 1) if stop in decode(ids[:i]))  # its last token
    spans = next(w for w in range(1, end + 1) if stop in decode(ids[end - w : end]))
    assert length < 48 or spans > 32  # longer than the old 32-token window
    params = SamplingParams(max_new_tokens=200, ignore_eos=True, stop=(stop,))
    res = SpeculativeEngine(target).generate([20, 30, 40], params)
    assert res.finish_reason == "stop"
    assert len(res.token_ids) == end  # decoding ended at the stop string's last token
    assert res.text == plain.text[: plain.text.find(stop)]

"""End-of-sequence ids that only ``generation_config.json`` lists (where instruct models put
their end-of-turn token, and vLLM stops on them too) end a native decode as well."""

from __future__ import annotations

import json

from autospec.engine.target import load_target
from tests.serve.helpers import make_tiny_model_dir


def test_generation_config_eos_ids_join_the_configs_tiny(tmp_path) -> None:
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    base = load_target(str(model_dir), dtype="float32", device="cpu").info.eos_token_ids
    extra = 7 if 7 not in base else 8
    (model_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [*base, extra]}))
    info = load_target(str(model_dir), dtype="float32", device="cpu").info
    assert info.eos_token_ids == (*base, extra)


def test_a_completion_prompt_gets_the_bos_its_tokenizer_adds_as_on_vllm_tiny(tmp_path) -> None:
    """vLLM's completions add the tokenizer's special tokens by default (a BOS for Llama,
    Mistral, Gemma): the native engine encodes a completion prompt the same way."""
    from tokenizers.processors import TemplateProcessing

    target = load_target(str(make_tiny_model_dir(tmp_path / "tiny")), dtype="float32",
                         device="cpu")
    plain = target.encode_prompt("Once upon a time")
    bos = target.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    target.tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    assert target.encode_prompt("Once upon a time") == [bos, *plain]

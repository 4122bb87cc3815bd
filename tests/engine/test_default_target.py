"""The engine on the real default target (SmolLM2-135M): few, short runs."""

import shutil

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from autospec.engine.generate import SpeculativeEngine
from autospec.engine.reference import OracleSpeculator
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import TargetLoadError, _resolve, embedded_gguf, load_target
from autospec.speculators.registry import new_speculator

pytestmark = pytest.mark.integration
CHAT = [{"role": "user", "content": "Rewrite in the passive voice: The cat chased the mouse."}]
PARAMS = SamplingParams(max_new_tokens=24)


def test_chat_template_is_applied(default_target):
    text = default_target.tokenizer.decode(default_target.encode_chat(CHAT))
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")


def test_greedy_speculative_equals_target_only_for_every_kind(default_target):
    prompt = default_target.encode_chat(CHAT)
    plain = SpeculativeEngine(default_target).generate(prompt, PARAMS)
    assert len(plain.token_ids) > 5
    specs = {kind: new_speculator(kind, default_target) for kind in ("ngram", "draft", "eagle3")}
    specs["oracle"] = OracleSpeculator(plain.token_ids)
    for kind, spec in specs.items():
        res = SpeculativeEngine(default_target, spec, 5).generate(prompt, PARAMS)
        assert res.token_ids == plain.token_ids, kind
        assert res.text == plain.text
    oracle = SpeculativeEngine(default_target, specs["oracle"], 5).generate(prompt, PARAMS)
    assert oracle.stats.tau > 4.0


def test_engine_target_only_matches_hf_generate(default_target):
    prompt = default_target.encode_chat(CHAT)
    plain = SpeculativeEngine(default_target).generate(prompt, PARAMS)
    with torch.inference_mode():
        out = default_target.model.generate(torch.tensor([prompt]), max_new_tokens=24,
                                            do_sample=False)
    assert out[0, len(prompt):].tolist() == plain.token_ids


def test_stop_string_cuts_text(default_target):
    prompt = default_target.encode_chat(CHAT)
    plain = SpeculativeEngine(default_target).generate(prompt, PARAMS)
    word = plain.text.split()[2]
    params = SamplingParams(max_new_tokens=24, stop=(word,))
    res = SpeculativeEngine(default_target, new_speculator("ngram", default_target), 4).generate(
        prompt, params)
    assert res.finish_reason == "stop" and word not in res.text
    assert plain.text.startswith(res.text)


def test_gguf_file_path_loads_from_the_cache(default_target):
    path, target_id = _resolve(str(embedded_gguf("smollm2-135m")))
    assert (path / "model.safetensors").exists() and target_id.endswith(".gguf")


def test_unknown_target_is_a_clear_error(tmp_path):
    with pytest.raises(TargetLoadError, match="neither a known name"):
        load_target("no-such-model")
    with pytest.raises(TargetLoadError, match=r"no config\.json"):
        load_target(str(tmp_path))


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_model_families_load_from_a_directory_tiny_random_init(default_target, tmp_path, family):
    """Tiny random-init Llama / Qwen2 / Mistral saved as HF directories (with the default
    target's tokenizer) load as targets and decode losslessly."""
    common = dict(vocab_size=default_target.info.vocab_size, hidden_size=32,
                  intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2)
    cls, cfg = {"llama": (LlamaForCausalLM, LlamaConfig),
                "qwen2": (Qwen2ForCausalLM, Qwen2Config),
                "mistral": (MistralForCausalLM, MistralConfig)}[family]
    torch.manual_seed(0)
    cls(cfg(**common)).save_pretrained(tmp_path)
    src, _ = _resolve("smollm2-135m")
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, tmp_path / f.name)
    target = load_target(str(tmp_path), dtype="float32")
    assert target.info.num_layers == 3 and target.model.config.model_type == family
    prompt = target.encode_chat(CHAT)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = SpeculativeEngine(target).generate(prompt, params)
    spec = new_speculator("ngram", target)
    assert SpeculativeEngine(target, spec, 4).generate(prompt, params).token_ids == plain.token_ids

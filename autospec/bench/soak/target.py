"""The short form's target: a tiny random-init Llama (2 layers, 32 wide) with the embedded
default's tokenizer and chat template, so chat requests, traffic rows and training work as on
the real one, in seconds on a CPU.

Its embeddings are untied: a tied tiny model answers every prompt with one repeated token, on
which every speculator is perfect and no candidate can beat the incumbent. The tokenizer comes
from the embedded default's cache directory (``<cache dir>/targets/``, written the first time
anything loads ``smollm2-135m``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from autospec.settings import get_settings

TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "chat_template")


def cached_tokenizer_dir() -> Path:
    """A cached target directory with SmolLM2's tokenizer files (loading the embedded
    default once writes it, when it is not there yet)."""
    root = get_settings().cache_dir / "targets"
    found = sorted(p for p in root.glob("SmolLM2*") if (p / "tokenizer.json").is_file())
    if not found:
        from autospec.engine.target import load_target

        load_target("smollm2-135m", dtype="float32", device="cpu")
        found = sorted(p for p in root.glob("SmolLM2*") if (p / "tokenizer.json").is_file())
    if not found:
        raise FileNotFoundError(f"no cached SmolLM2 target under {root}")
    return found[0]


def write_tiny_target(out: Path, *, seed: int = 0, layers: int = 2, tied: bool = False,
                      max_positions: int = 1024, tokenizer_dir: Path | None = None) -> Path:
    """Write a tiny random-init Llama (``layers`` layers, 32 wide, SmolLM2's vocabulary) with
    the tokenizer files of ``tokenizer_dir`` (default: :func:`cached_tokenizer_dir`) to
    ``out`` (once; an existing one is kept) and return it. The soak's is untied with 1024
    positions; ``tied`` embeddings make a model that repeats one token (the serving tests')."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    src = tokenizer_dir if tokenizer_dir is not None else cached_tokenizer_dir()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, eos_token_id=2, bos_token_id=1,
                      tie_word_embeddings=tied)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(TOKENIZER_PREFIXES):
            shutil.copy(f, out / f.name)
    return out

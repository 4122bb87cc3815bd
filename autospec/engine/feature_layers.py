"""Feature layers: the target's hidden states a speculator reads, numbered as vLLM numbers them.

A feature layer id ``i`` in ``[0, N]`` (``N``: the target's number of decoder layers) is the
residual stream after ``i`` decoder layers: ``0`` is the embedding output, ``i`` the output of
decoder layer ``i``, and ``N`` the last decoder layer's output *before* the target's final
norm. That is what vLLM 0.32 collects for EAGLE-3
(``_maybe_add_hidden_state`` in ``LlamaModel.forward``: ``hidden_states + residual`` after
each layer, the norm applied after the loop), so a head reads the same features under
autospec's native engine, in its training, and on vLLM. Hugging Face's ``hidden_states``
tuple agrees below ``N``, but its last entry is the final norm's output
(``last_hidden_state``): id ``N`` is read from a forward hook on the last decoder layer.

:func:`forward_with_features` is the one reader; :meth:`autospec.engine.target.Target.forward`
(serving, replay) and the training features (:mod:`autospec.train.features`) both call it.
It knows the decoder layers of Hugging Face causal LMs that keep them in
``get_decoder().layers`` (Llama, Mistral, Qwen2/3, Gemma, Phi-3...), nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel


def forward_with_features(model: PreTrainedModel, layers: tuple[int, ...],
                          **inputs: Any) -> tuple[Any, torch.Tensor | None]:
    """``model(**inputs)`` and the features of ``layers`` (in that order, repeats kept):
    ``[batch, seq, len(layers) * hidden]``, None when ``layers`` is empty."""
    if not layers:
        return model(**inputs), None
    depth = int(model.config.num_hidden_layers)
    if any(not 0 <= i <= depth for i in layers):
        raise ValueError(f"feature layers {list(layers)} outside [0, {depth}] (the target "
                         f"has {depth} decoder layers)")
    last: list[torch.Tensor] = []
    tap = _output_of(_last_decoder_layer(model, depth), last) if depth in layers \
        else nullcontext()
    with tap:
        out = model(**inputs, output_hidden_states=any(i < depth for i in layers))
    assert depth not in layers or len(last) == 1, f"the last layer ran {len(last)} times"
    states = [last[0] if i == depth else out.hidden_states[i] for i in layers]
    return out, torch.cat(states, dim=-1)


def _last_decoder_layer(model: PreTrainedModel, depth: int) -> nn.Module:
    """The module whose output is feature layer ``depth`` (the last decoder layer)."""
    decoder = model.get_decoder()
    found = getattr(decoder, "layers", None)
    if not isinstance(found, nn.ModuleList) or len(found) != depth:
        raise ValueError(f"cannot find the {depth} decoder layers of {type(model).__name__} "
                         f"(get_decoder().layers), to read feature layer {depth} before the "
                         f"final norm")
    return found[-1]


@contextmanager
def _output_of(module: nn.Module, into: list[torch.Tensor]) -> Iterator[None]:
    """Append ``module``'s output (its first element, for a tuple) to ``into`` while inside,
    for forwards on this thread only (another thread may run the same model meanwhile)."""
    thread = threading.get_ident()

    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        if threading.get_ident() == thread:
            into.append(output[0] if isinstance(output, tuple) else output)

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()

"""How a ``draft`` trains: KL distillation from the target's top-K, initialised from the
target's own layers or warm-started from the incumbent.

:class:`DraftTrainee`: the small LM at position ``t`` predicts token ``t + 1``; loss = KL
from the target's top-K distribution (renormalised) to the draft's, counted only where the
predicted token is one the target generated (outputs, not prompts) and the context holds no
output EOS (decoding stops at the first; an output logged past it is cut there). Forward
returns ``(loss, correct [1], counted [1])``; correct = the draft's top-1 equals the
target's greedy token. :class:`DraftRecipe` is the kind's
:class:`~autospec.speculators.training.Recipe`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import LlamaForCausalLM

from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import DraftConfig
from autospec.speculators.draft.model import DraftSpeculator, llama_config
from autospec.speculators.training import (
    FeatureCache,
    IncumbentMismatch,
    TraineeOptions,
    TrainSequence,
    arch_fields,
    on_device,
    output_mask,
    pad_stack,
    target_lm_rows,
)

log = logging.getLogger(__name__)


class DraftTrainee(nn.Module):
    """A draft LM under KL distillation from the target's top-K; see the module docstring."""

    def __init__(self, model: nn.Module, *, eos_ids: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.steps = 1
        self.register_buffer("eos", torch.tensor(eos_ids, dtype=torch.long), persistent=False)

    def make_batch(self, cache: FeatureCache, indices: list[int]) -> dict[str, torch.Tensor]:
        ids, top_ids, top_lp, valid = [], [], [], []
        for i in indices:
            span = cache.span(i)
            n = span.stop - span.start
            ids.append(cache.ids[span])
            top_ids.append(cache.top_ids[span].long())
            top_lp.append(cache.top_logprobs[span].float())
            valid.append(output_mask(cache, i, n, self.eos.cpu()))
        width = max(x.shape[0] for x in ids)
        lengths = torch.tensor([x.shape[0] for x in ids])
        return on_device(self.model.lm_head.weight.device, {
            "input_ids": pad_stack(ids, width),
            "attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long(),
            "top_ids": pad_stack(top_ids, width),
            "top_logprobs": pad_stack(top_lp, width, -1e4),
            "valid": pad_stack(valid, width, False)})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                top_ids: torch.Tensor, top_logprobs: torch.Tensor, valid: torch.Tensor):
        """input_ids/attention_mask/valid ``[B, T]``, top_* ``[B, T, K]``."""
        assert input_ids.dim() == 2 and top_ids.dim() == 3
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state  # [B, T, H]
        logits = self.model.lm_head(hidden[valid]).float()  # [M, V]: only counted positions
        logq = torch.log_softmax(logits, -1)
        logp = torch.log_softmax(top_logprobs[valid], -1)  # [M, K] renormalised top-K
        kl = (logp.exp() * (logp - logq.gather(-1, top_ids[valid]))).sum(-1)
        count = valid.sum()
        loss = kl.sum() / count.clamp_min(1)
        correct = (logits.argmax(-1) == top_ids[valid][:, 0]).sum()
        return loss, correct.view(1).detach(), count.view(1).detach()


class DraftRecipe:
    feature_layers_needed = False

    def prepare(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
                incumbent: SavableSpeculator | None) -> dict[str, Any]:
        assert isinstance(spec, DraftSpeculator)
        spec.hold_float32()  # train in float32
        if incumbent is None:
            return {"init": "target-layers", "copied_layers": init_draft_from_target(spec, target)}
        if not isinstance(incumbent, DraftSpeculator) or arch_fields(incumbent.config) != \
                arch_fields(spec.config):
            raise IncumbentMismatch("the incumbent draft has another architecture; "
                                    "train with --from-scratch")
        spec.load_tensors(incumbent.state_tensors())
        return {"init": "incumbent"}

    def trainee(self, spec: SavableSpeculator, opts: TraineeOptions) -> nn.Module:
        assert isinstance(spec, DraftSpeculator)
        return DraftTrainee(spec.model, eos_ids=opts.eos_ids)

    def shared(self, spec: SavableSpeculator) -> dict[str, torch.Tensor]:
        assert isinstance(spec, DraftSpeculator)
        if not spec.config.share_target_embeddings:
            return {}
        return {"embed": spec.model.model.embed_tokens.weight.float(),
                "lm_head": spec.model.lm_head.weight.float()}

    def trainee_from_tensors(self, config: DraftConfig, state: dict[str, torch.Tensor],
                             shared: dict[str, torch.Tensor], opts: TraineeOptions) -> nn.Module:
        model = LlamaForCausalLM(llama_config(config))
        if shared:
            model.model.embed_tokens.weight = nn.Parameter(shared["embed"], requires_grad=False)
            model.lm_head.weight = nn.Parameter(shared["lm_head"], requires_grad=False)
        trainee = DraftTrainee(model, eos_ids=opts.eos_ids)
        self.load_state(trainee, state)
        return trainee

    def state_of(self, trainee: nn.Module) -> dict[str, torch.Tensor]:
        assert isinstance(trainee, DraftTrainee)
        frozen = {n for n, p in trainee.model.named_parameters() if not p.requires_grad}
        return {n: t for n, t in trainee.model.state_dict().items() if n not in frozen}

    def load_state(self, trainee: nn.Module, state: dict[str, torch.Tensor]) -> None:
        assert isinstance(trainee, DraftTrainee)
        _, unexpected = trainee.model.load_state_dict(state, strict=False)
        assert not unexpected, f"unexpected draft tensors {unexpected}"

    def finish(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
               incumbent: SavableSpeculator | None) -> dict[str, Any]:
        return {}

    def adopt_base(self, spec: SavableSpeculator) -> None:
        """Nothing to update: a base draft warm-starts as it is."""



@torch.no_grad()
def init_draft_from_target(spec: DraftSpeculator, target: Target) -> list[int]:
    """Copy evenly spaced target layers (first and last included) and the final norm.

    Skipped (random init kept) when the shapes differ. Returns the layers copied.
    """
    src_layers = getattr(getattr(target.model, "model", None), "layers", None)
    dst = spec.model.model
    if src_layers is None:
        return []
    n_src, n_dst = len(src_layers), len(dst.layers)
    picks = torch.linspace(0, n_src - 1, n_dst).round().long().tolist() if n_dst > 1 else [0]
    copied = []
    for d, s in enumerate(picks):
        src, want = src_layers[s].state_dict(), dst.layers[d].state_dict()
        if src.keys() != want.keys() or any(src[k].shape != want[k].shape for k in want):
            log.info("draft layer %d: target layer %d has another shape; random init", d, s)
            continue
        dst.layers[d].load_state_dict({k: v.to(want[k]) for k, v in src.items()})
        copied.append(s)
    _, norm = target_lm_rows(target)
    if norm is not None and norm.shape == dst.norm.weight.shape:
        dst.norm.weight.copy_(norm.to(dst.norm.weight))
    return copied

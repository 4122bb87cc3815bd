"""What each trainable kind optimises: a module whose ``forward(**batch)`` is the loss.

A *trainee* wraps the speculator's own ``nn.Module`` (so DDP can wrap the trainee and
the gradients reach the speculator's parameters) and knows how to cut a batch out of a
:class:`~autospec.train.features.FeatureCache`:

- :class:`Eagle3Trainee`: the pair at position ``t`` is ``(features[t], ids[t + 1])``
  and its output predicts token ``t + 2``, whose teacher is the target's distribution
  at position ``t + 1``. The head is unrolled ``steps`` draft steps (training-time
  test, :meth:`~autospec.speculators.eagle3.Eagle3Head.ttt_forward`); step ``s`` counts
  only where its real prefix ends inside the output (``t - s >= prompt_len - 1``),
  as in decoding. Loss ``"kl"``: cross-entropy to the target's top-K distribution
  restricted to the draft vocabulary (= KL up to a constant); ``"ce"``: to the
  target's greedy token. Step ``s`` is weighted ``step_decay ** s``.
- :class:`DraftTrainee`: the small LM at position ``t`` predicts token ``t + 1``; loss =
  KL from the target's top-K distribution (renormalised) to the draft's.

Both count a position only where the token it predicts is one the target generated
(outputs, not prompts) and the context does not end in EOS. Forward returns
``(loss, correct [steps], counted [steps])``; correct = the draft's top-1 equals the
target's greedy token. Also here: warm starts and initialisations from the target.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from autospec.engine.target import Target
from autospec.speculators.draft import DraftSpeculator
from autospec.speculators.eagle3 import Eagle3Head, Eagle3Speculator
from autospec.train.features import FeatureCache

log = logging.getLogger(__name__)

LOSSES = ("kl", "ce")


def _pad_stack(rows: list[torch.Tensor], width: int, value: float = 0) -> torch.Tensor:
    """Right-pad each ``[n_i, ...]`` row to ``width`` and stack: ``[B, width, ...]``."""
    out = rows[0].new_full((len(rows), width, *rows[0].shape[1:]), value)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def _on(device: torch.device, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch built on the host (from the feature cache), moved to the trainee's device."""
    return {name: t.to(device) for name, t in batch.items()}


def _output_mask(cache: FeatureCache, i: int, n: int, eos: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: position ``t`` predicts an output token, from a context not ending in EOS."""
    seq = cache.ids[cache.span(i)]
    t = torch.arange(n)
    return (t >= int(cache.prompt_lens[i]) - 1) & ~torch.isin(seq[:n], eos)


class Eagle3Trainee(nn.Module):
    """An :class:`Eagle3Head` under the training-time-test loss; see the module docstring."""

    def __init__(self, head: Eagle3Head, *, steps: int, loss: str = "kl",
                 step_decay: float = 0.8, eos_ids: tuple[int, ...] = (),
                 feature_noise: float = 0.0) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        self.head, self.steps, self.loss_kind, self.step_decay = head, steps, loss, step_decay
        self.feature_noise = feature_noise
        self.register_buffer("eos", torch.tensor(eos_ids, dtype=torch.long), persistent=False)

    def make_batch(self, cache: FeatureCache, indices: list[int]) -> dict[str, torch.Tensor]:
        """Padded tensors of sequences ``indices``; position t pairs features[t], ids[t + 1]."""
        assert cache.features is not None, "eagle3 needs target features"
        feats, nxt, top_ids, top_lp, valid = [], [], [], [], []
        for i in indices:
            span = cache.span(i)
            n = span.stop - span.start - 1  # pairs: positions 0..L-2
            feats.append(cache.features[span][:n])
            nxt.append(cache.ids[span][1:])
            top_ids.append(cache.top_ids[span][1:].long())  # teacher of t + 2 sits at t + 1
            top_lp.append(cache.top_logprobs[span][1:].float())
            # the pair's token (t + 1) must be an output token and not EOS
            mask = _output_mask(cache, i, n + 1, self.eos.cpu())[1:]
            valid.append(mask)
        width = max(f.shape[0] for f in feats)
        dtype = self.head.fc.weight.dtype
        return _on(self.head.fc.weight.device, {
            "features": _pad_stack(feats, width).to(dtype), "next_ids": _pad_stack(nxt, width),
            "top_ids": _pad_stack(top_ids, width),
            "top_logprobs": _pad_stack(top_lp, width, -1e4),
            "valid": _pad_stack(valid, width, False)})

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, top_ids: torch.Tensor,
                top_logprobs: torch.Tensor, valid: torch.Tensor):
        """features ``[B, T, F]``, next_ids ``[B, T]``, top_* ``[B, T, K]``, valid ``[B, T]``.

        The LM head and softmax run only at the positions a step counts.
        """
        assert features.dim() == 3 and top_ids.dim() == 3 and valid.dim() == 2
        if self.training and self.feature_noise > 0:  # regularises a head fit on little data
            features = _noisy(features, self.feature_noise, self.head.config.hidden_size)
        any_valid = valid.any(0)
        start = int(any_valid.float().argmax()) if bool(any_valid.any()) else 0
        # step 0: [B, T, H]; draft steps from the first counted position on: [B, T - start, H]
        outputs = self.head.ttt_hidden(features, next_ids, self.steps, start=start)
        t2d = torch.full((self.head.config.target_vocab_size,), -1, dtype=torch.long,
                         device=top_ids.device)
        t2d[self.head.d2t] = torch.arange(self.head.d2t.shape[0], device=top_ids.device)
        draft_ids = t2d[top_ids]  # [B, T, K]; -1: not in the draft vocabulary
        teachable = (draft_ids >= 0)[..., 0] if self.loss_kind == "ce" else (draft_ids >= 0).any(-1)
        loss = features.new_zeros((), dtype=torch.float32)
        correct, counted = [], []
        for s, out in enumerate(outputs):
            # real prefix inside the output, and a teacher the draft vocabulary can follow
            mask = valid & F.pad(valid, (s, 0))[:, : valid.shape[1]] & teachable  # 0 before start
            logits = self.head.logits(out[mask[:, -out.shape[1]:]]).float()  # [M, Vd]
            loss = loss + self.step_decay ** s * self._loss(logits, draft_ids[mask],
                                                            top_logprobs[mask])
            correct.append((self.head.d2t[logits.argmax(-1)] == top_ids[mask][:, 0]).sum())
            counted.append(mask.sum())
        return loss, torch.stack(correct).detach(), torch.stack(counted).detach()

    def _loss(self, logits: torch.Tensor, draft_ids: torch.Tensor,
              top_lp: torch.Tensor) -> torch.Tensor:
        """Mean loss of rows ``logits [M, Vd]`` against the target's top-K ``[M, K]``."""
        if logits.shape[0] == 0:
            return logits.sum()  # no counted position: zero, still part of the graph
        logq = torch.log_softmax(logits, -1)  # [M, Vd]
        present = draft_ids >= 0
        if self.loss_kind == "ce":
            nll = -logq.gather(-1, draft_ids[:, :1]).squeeze(-1)
        else:
            p = torch.softmax(top_lp.float().masked_fill(~present, -1e4), -1) * present
            nll = -(p * logq.gather(-1, draft_ids.clamp_min(0))).sum(-1)
        return nll.mean()


def _noisy(features: torch.Tensor, scale: float, width: int) -> torch.Tensor:
    """``features`` plus Gaussian noise of ``scale`` times each layer block's RMS."""
    blocks = features.unflatten(-1, (-1, width))  # [B, T, layers, H]
    rms = blocks.float().pow(2).mean(-1, keepdim=True).sqrt()
    noise = torch.randn(blocks.shape, device=features.device) * rms * scale
    return (blocks + noise.to(blocks.dtype)).flatten(-2)


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
            valid.append(_output_mask(cache, i, n, self.eos.cpu()))
        width = max(x.shape[0] for x in ids)
        lengths = torch.tensor([x.shape[0] for x in ids])
        return _on(self.model.lm_head.weight.device, {
            "input_ids": _pad_stack(ids, width),
            "attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long(),
            "top_ids": _pad_stack(top_ids, width),
            "top_logprobs": _pad_stack(top_lp, width, -1e4),
            "valid": _pad_stack(valid, width, False)})

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


# -- warm starts and initialisations ------------------------------------------------------
def target_lm_rows(target: Target) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's LM head ``[V, H]`` and final norm weight ``[H]`` (None if it has none)."""
    head = target.model.get_output_embeddings().weight
    norm = getattr(getattr(target.model, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    return head.detach(), None if weight is None else weight.detach()


@torch.no_grad()
def init_eagle3_from_target(spec: Eagle3Speculator, target: Target) -> None:
    """LM head rows = the target's rows of the draft vocabulary; final norm = the target's."""
    rows, norm = target_lm_rows(target)
    head = spec.head
    head.lm_head.weight.copy_(rows[head.d2t.to(rows.device)].to(head.lm_head.weight))
    if norm is not None and norm.shape == head.norm.weight.shape:
        head.norm.weight.copy_(norm.to(head.norm.weight))


@torch.no_grad()
def warm_start_eagle3(spec: Eagle3Speculator, incumbent: Eagle3Speculator,
                      new_d2t: torch.Tensor, target: Target) -> int:
    """Copy the incumbent's weights into ``spec`` with draft vocabulary ``new_d2t``.

    LM head rows of tokens in both vocabularies are the incumbent's (remapped to their
    new rows); rows of new tokens come from the target's LM head. Returns rows kept.
    """
    skip = ("d2t", "lm_head.weight")
    old = {k: v for k, v in incumbent.head.state_dict().items() if k not in skip}
    spec.head.load_state_dict({**spec.head.state_dict(), **old})
    spec.head.set_draft_vocab(new_d2t)
    init_eagle3_from_target(spec, target)  # every row from the target ...
    old_d2t = incumbent.head.d2t.cpu()
    position = {int(t): i for i, t in enumerate(old_d2t.tolist())}
    new_rows, old_rows = [], []
    for j, t in enumerate(new_d2t.tolist()):
        if t in position:
            new_rows.append(j)
            old_rows.append(position[t])
    if new_rows:  # ... then the incumbent's rows wherever the token is still there
        w = incumbent.head.lm_head.weight
        spec.head.lm_head.weight[torch.tensor(new_rows)] = w[torch.tensor(old_rows)].to(
            spec.head.lm_head.weight)
    spec.head.norm.weight.copy_(incumbent.head.norm.weight)
    return len(new_rows)


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

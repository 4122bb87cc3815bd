"""How an ``eagle3`` head trains: the training-time-test loss, initialisations and warm
starts, and the kind's :class:`~autospec.speculators.training.Recipe`.

:class:`Eagle3Trainee`: the pair at position ``t`` is ``(features[t], ids[t + 1])`` and its
output predicts token ``t + 2``, whose teacher is the target's distribution at position
``t + 1``. The head is unrolled ``steps`` draft steps (training-time test,
:meth:`~autospec.speculators.eagle3.model.Eagle3Head.ttt_forward`); step ``s`` counts only
where its real prefix ends inside the output (``t - s >= prompt_len - 1``), as in decoding
(a head's first draft reads the last prompt position's features and the first output
token: pair ``prompt_len - 1``; pair ``prompt_len - 2`` would predict the first output
token, which the target itself produces), and neither the real prefix nor the chain holds
an output EOS (decoding stops at the first: the last pair counted predicts it; an output
logged past it, ``ignore_eos``, is cut there). The last pair of an output cut short by
``max_tokens`` counts: its teacher is the target's distribution after the output. Loss
``"kl"``: cross-entropy to the target's top-K distribution restricted to the draft
vocabulary (= KL up to a constant); ``"ce"``: to the target's greedy token. Step ``s`` is
weighted ``step_decay ** s``. Forward returns ``(loss, correct [steps], counted [steps])``;
correct = the draft's top-1 equals the target's greedy token.

:class:`Eagle3Recipe` sets the draft vocabulary (:mod:`~autospec.speculators.eagle3.vocab`)
and the initialisation (the target's LM-head rows, or the incumbent's weights), and after
training builds the head's suffix index over the window.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import Eagle3Config
from autospec.speculators.eagle3.model import Eagle3Head
from autospec.speculators.eagle3.speculator import Eagle3Speculator, index_config
from autospec.speculators.eagle3.vocab import build_draft_vocab, token_counts, vocab_rank
from autospec.speculators.suffix import build_corpus, suffix_from_documents
from autospec.speculators.training import (
    LOSSES,
    FeatureCache,
    IncumbentMismatch,
    TraineeOptions,
    TrainSequence,
    arch_fields,
    documents,
    on_device,
    pad_stack,
    past_eos,
    target_lm_rows,
)


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
            valid.append(pair_mask(cache, i, n, self.eos.cpu()))
        width = max(f.shape[0] for f in feats)
        dtype = self.head.fc.weight.dtype
        return on_device(self.head.fc.weight.device, {
            "features": pad_stack(feats, width).to(dtype), "next_ids": pad_stack(nxt, width),
            "top_ids": pad_stack(top_ids, width),
            "top_logprobs": pad_stack(top_lp, width, -1e4),
            "valid": pad_stack(valid, width, False)})

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


def pair_mask(cache: FeatureCache, i: int, n: int, eos: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: pair ``t`` of sequence ``i`` (``features[t]``, ``ids[t + 1]``) counts at
    step 0: its token ``t + 1`` is an output token (``t >= prompt_len - 1``) and neither it
    nor an output token before it is EOS (:func:`past_eos`). The counted pairs are one run,
    so step ``s`` (pairs ``t`` and ``t - s`` counted) counts no chain that crosses an EOS."""
    return (torch.arange(n) >= int(cache.prompt_lens[i]) - 1) & ~past_eos(cache, i, eos)[1 : n + 1]


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


class Eagle3Recipe:
    feature_layers_needed = True

    def prepare(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
                incumbent: SavableSpeculator | None) -> dict[str, Any]:
        assert isinstance(spec, Eagle3Speculator)
        spec.hold_float32()  # train in float32 (the target's embedding table stays shared)
        cfg = spec.config
        counts = token_counts(train, cfg.target_vocab_size)
        d2t = build_draft_vocab(vocab_rank(counts, incumbent_d2t(incumbent)), cfg.draft_vocab_size,
                                vocab_size=cfg.target_vocab_size,
                                always=target.info.eos_token_ids)
        seen = int((counts >= 1e6).sum())
        coverage = float(counts[d2t].sum() // 1e6) / max(1.0, float(counts.sum() // 1e6))
        if incumbent is None:
            spec.head.set_draft_vocab(d2t)
            init_eagle3_from_target(spec, target)
            return {"init": "target-lm-head", "draft_vocab_seen_tokens": seen,
                    "draft_vocab_output_coverage": coverage}
        if not isinstance(incumbent, Eagle3Speculator) or arch_fields(incumbent.config) != \
                arch_fields(cfg):
            raise IncumbentMismatch("the incumbent eagle3 head has another architecture "
                                    "(hidden size, layers, heads); train with --from-scratch")
        kept = warm_start_eagle3(spec, incumbent, d2t, target)
        return {"init": "incumbent", "draft_vocab_rows_kept": kept,
                "draft_vocab_seen_tokens": seen, "draft_vocab_output_coverage": coverage}

    def trainee(self, spec: SavableSpeculator, opts: TraineeOptions) -> nn.Module:
        assert isinstance(spec, Eagle3Speculator)
        return Eagle3Trainee(spec.head, steps=opts.ttt_steps, loss=opts.loss,
                             step_decay=opts.step_decay, eos_ids=opts.eos_ids,
                             feature_noise=opts.feature_noise)

    def shared(self, spec: SavableSpeculator) -> dict[str, torch.Tensor]:
        assert isinstance(spec, Eagle3Speculator)
        return {"embed_weight": spec.head.embed_weight.float()}

    def trainee_from_tensors(self, config: Eagle3Config, state: dict[str, torch.Tensor],
                             shared: dict[str, torch.Tensor], opts: TraineeOptions) -> nn.Module:
        head = Eagle3Head(config, shared["embed_weight"])
        head.load_state_dict(state)
        head.set_draft_vocab(state["d2t"].long())
        return Eagle3Trainee(head, steps=opts.ttt_steps, loss=opts.loss,
                             step_decay=opts.step_decay, eos_ids=opts.eos_ids,
                             feature_noise=opts.feature_noise)

    def state_of(self, trainee: nn.Module) -> dict[str, torch.Tensor]:
        assert isinstance(trainee, Eagle3Trainee)
        return dict(trainee.head.state_dict())

    def load_state(self, trainee: nn.Module, state: dict[str, torch.Tensor]) -> None:
        assert isinstance(trainee, Eagle3Trainee)
        trainee.head.load_state_dict(state)
        trainee.head.set_draft_vocab(state["d2t"].long())

    def finish(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
               incumbent: SavableSpeculator | None) -> dict[str, Any]:
        """Build the suffix index (unless the config has none): the part carried from the
        incumbent's index (:meth:`Eagle3Speculator.carried_corpus`), or from scratch the
        window's synthetic answers, then the window's traffic."""
        assert isinstance(spec, Eagle3Speculator)
        if spec.config.suffix_threshold is None:
            spec.attach_suffix(None)
            return {}
        started = time.perf_counter()
        config = index_config(spec.config)
        carried = incumbent.carried_corpus() if isinstance(incumbent, Eagle3Speculator) else None
        docs = train
        if carried is None:  # nothing carried in: the window's own synthetic answers are
            carried = build_corpus(documents([s for s in train if s.synthetic]),
                                   config.prompt_tail)
            docs = [s for s in train if not s.synthetic]
        index = suffix_from_documents(config, documents(docs), target, carried=carried)
        spec.attach_suffix(index)
        spec.config = spec.config.model_copy(update={"suffix_carried_tokens": len(carried)})
        return {"suffix_tokens": index.corpus_tokens, "suffix_carried_tokens": len(carried),
                "suffix_build_s": time.perf_counter() - started}

    def adopt_base(self, spec: SavableSpeculator) -> None:
        """A base pretrained before ``suffix_carried_tokens`` existed: its whole index is the
        target's own answers (pretrain trains on synthetic sequences only)."""
        if isinstance(spec, Eagle3Speculator) and not spec.config.suffix_carried_tokens:
            spec.config = spec.config.model_copy(
                update={"suffix_carried_tokens": spec.config.suffix_tokens})


def incumbent_d2t(incumbent: SavableSpeculator | None) -> torch.Tensor | None:
    """The incumbent head's draft vocabulary, when warm-starting from an eagle3 head."""
    return incumbent.head.d2t if isinstance(incumbent, Eagle3Speculator) else None

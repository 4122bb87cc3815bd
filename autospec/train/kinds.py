"""Per-kind training recipes: how a speculator becomes a trainee and back, and what it needs.

Each recipe (:data:`RECIPES`, an explicit registry) turns a freshly initialised or
warm-started speculator into a trainee (:mod:`autospec.train.models`) and the trainee's
weights back into the speculator's ``state_tensors()`` names, in two ways:

- ``trainee(spec, job)`` in the driver process (the speculator's own modules);
- ``trainee_from_tensors(config, state, shared, job)`` in a Ray worker, which has no
  target: ``shared`` holds the frozen target tensors the kind borrows (the embedding
  for ``eagle3``; the embedding and LM head for ``draft``), shipped with the job.

``prepare(spec, data, target, incumbent, job)`` sets the draft vocabulary and
initialisation (warm start from the incumbent, or from the target's own weights);
``finish(spec, train, target)`` adds what is built rather than trained (the ``eagle3``
head's suffix index over the training window).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from transformers import LlamaForCausalLM

from autospec.engine.target import Target
from autospec.speculators.common import SavableSpeculator
from autospec.speculators.config import DraftConfig, Eagle3Config
from autospec.speculators.draft import DraftSpeculator, llama_config
from autospec.speculators.eagle3 import (
    Eagle3Head,
    Eagle3Speculator,
    build_draft_vocab,
    index_config,
)
from autospec.speculators.suffix import build_corpus, suffix_from_documents
from autospec.train.data import TrainSequence, documents
from autospec.train.errors import IncumbentMismatch
from autospec.train.models import (
    DraftTrainee,
    Eagle3Trainee,
    init_draft_from_target,
    init_eagle3_from_target,
    warm_start_eagle3,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraineeOptions:
    """What the trainee needs besides weights (JSON-able, shipped to Ray workers)."""

    ttt_steps: int = 3
    loss: str = "kl"
    step_decay: float = 0.8
    eos_ids: tuple[int, ...] = ()
    feature_noise: float = 0.0  # eagle3: training noise on the target features (x layer RMS)


class Recipe(Protocol):
    feature_layers_needed: bool

    def prepare(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
                incumbent: SavableSpeculator | None) -> dict[str, Any]: ...

    def trainee(self, spec: SavableSpeculator, opts: TraineeOptions) -> nn.Module: ...

    def shared(self, spec: SavableSpeculator) -> dict[str, torch.Tensor]: ...

    def trainee_from_tensors(self, config: Any, state: dict[str, torch.Tensor],
                             shared: dict[str, torch.Tensor],
                             opts: TraineeOptions) -> nn.Module: ...

    def state_of(self, trainee: nn.Module) -> dict[str, torch.Tensor]: ...

    def finish(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
               incumbent: SavableSpeculator | None) -> dict[str, Any]: ...

    def load_state(self, trainee: nn.Module, state: dict[str, torch.Tensor]) -> None: ...


def token_counts(train: list[TrainSequence], vocab_size: int) -> torch.Tensor:
    """Output-token counts first, prompt tokens only to break ties / fill: ``[vocab_size]``."""
    out, prompt = Counter(), Counter()
    for seq in train:
        out.update(seq.ids[seq.prompt_len :])
        prompt.update(seq.ids[: seq.prompt_len])
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for table, weight in ((out, 1e6), (prompt, 1.0)):
        if table:
            ids = torch.tensor(list(table.keys()))
            keep = (ids >= 0) & (ids < vocab_size)
            counts[ids[keep]] += weight * torch.tensor(list(table.values()),
                                                       dtype=torch.float64)[keep]
    return counts


# a warm-start keeps the incumbent's draft tokens ahead of tokens seen only in prompts (below
# any output token, weighted 1e6 by token_counts, above any prompt count of a window)
INCUMBENT_TOKEN_WEIGHT = 1e5


def _vocab_rank(counts: torch.Tensor, incumbent: SavableSpeculator | None) -> torch.Tensor:
    """What the draft vocabulary is ranked by: the window's token counts, and for a
    warm-start the incumbent's draft tokens right after the window's output tokens. A
    window is small beside the data the incumbent (a base head above all) was trained on:
    filling the vocabulary's rest with the window's prompt tokens and the lowest ids would
    throw away trained LM-head rows of tokens the traffic has not shown yet, such as
    another domain's (a demo's base head, 8192 rows, kept 7145 of them when fine-tuned on
    33 support requests that way; 8157 on 96 with the incumbent's tokens ranked here)."""
    if not isinstance(incumbent, Eagle3Speculator):
        return counts
    rank = counts.clone()
    rank[incumbent.head.d2t.cpu()] += INCUMBENT_TOKEN_WEIGHT
    return rank


class Eagle3Recipe:
    feature_layers_needed = True

    def prepare(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
                incumbent: SavableSpeculator | None) -> dict[str, Any]:
        assert isinstance(spec, Eagle3Speculator)
        spec.head.float()
        cfg = spec.config
        counts = token_counts(train, cfg.target_vocab_size)
        d2t = build_draft_vocab(_vocab_rank(counts, incumbent), cfg.draft_vocab_size,
                                vocab_size=cfg.target_vocab_size,
                                always=target.info.eos_token_ids)
        seen = int((counts >= 1e6).sum())
        coverage = float(counts[d2t].sum() // 1e6) / max(1.0, float(counts.sum() // 1e6))
        if incumbent is None:
            spec.head.set_draft_vocab(d2t)
            init_eagle3_from_target(spec, target)
            return {"init": "target-lm-head", "draft_vocab_seen_tokens": seen,
                    "draft_vocab_output_coverage": coverage}
        if not isinstance(incumbent, Eagle3Speculator) or _arch(incumbent.config) != _arch(cfg):
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


class DraftRecipe:
    feature_layers_needed = False

    def prepare(self, spec: SavableSpeculator, train: list[TrainSequence], target: Target,
                incumbent: SavableSpeculator | None) -> dict[str, Any]:
        assert isinstance(spec, DraftSpeculator)
        _unshare_for_training(spec)
        if incumbent is None:
            return {"init": "target-layers", "copied_layers": init_draft_from_target(spec, target)}
        if not isinstance(incumbent, DraftSpeculator) or _arch(incumbent.config) != _arch(
                spec.config):
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


def _unshare_for_training(spec: DraftSpeculator) -> None:
    """Train in float32 on frozen float32 *copies* of the borrowed target tensors.

    ``model.float()`` converts parameters in place, and the draft's embedding and LM head
    are the target's own Parameters: casting them would change the target's dtype.
    """
    model = spec.model
    if spec.config.share_target_embeddings:
        for owner in (model.model.embed_tokens, model.lm_head):
            owner.weight = nn.Parameter(owner.weight.detach().float().clone(),
                                        requires_grad=False)
    model.float()


def _arch(config: Any) -> dict[str, Any]:
    """The config fields that fix tensor shapes (besides the draft vocabulary)."""
    skip = {"target_id", "target_revision", "draft_vocab_size", "ttt_steps", "suffix_threshold",
            "suffix_tokens", "suffix_carried_tokens", "tree_nodes", "tree_width",
            "tree_min_prob"}
    return {k: v for k, v in config.model_dump().items() if k not in skip}


RECIPES: dict[str, Recipe] = {"eagle3": Eagle3Recipe(), "draft": DraftRecipe()}

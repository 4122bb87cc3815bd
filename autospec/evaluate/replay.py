"""Shadow replay: the acceptance a speculator would have had on logged requests.

For a **greedy** request the logged output *is* the target's choice at every position, so
one teacher-forced target pass over ``prompt + output`` supplies every feature the
speculator needs; the speculator then runs exactly as in decoding (same ``begin`` /
``commit`` / ``propose`` calls, same ``k`` as the live loop would use) and its drafts are
accepted while they equal the logged tokens. No target decoding: the result is what the
live engine would have counted: a request's last token is the last step's own, never an
accepted draft (a draft equal to it, or past it, is counted as rejected), as the engines count
a stop token that ends a request (drafting it saves no step) and as drafts stop before
``max_tokens``. The seconds spent in the speculator's calls are
summed too (``draft_s``): its real draft-side cost on this traffic.

For a **sampled** request the accepted count is random; replay uses its expectation.
Draft position ``i`` is accepted with probability ``α_i = Σ_x min(p_i(x), q_i(x))`` given
the earlier ones were, ``p`` being the target's distribution after the logged prefix (the
same temperature / top-k / top-p as the request) and ``q`` the speculator's; a step's
expected accepted count is ``Σ_i Π_{j≤i} α_j``, and the replay advances along the logged
output by one plus that count, rounded.

Knows nothing of the store: it takes token ids and sampling settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from autospec.engine.clock import clock
from autospec.engine.protocol import Proposal, Speculator
from autospec.engine.sampling import SamplingParams, penalized, probs_from_logits
from autospec.engine.stats import tau
from autospec.engine.target import Target
from autospec.engine.verify import accept_tree


@dataclass(frozen=True)
class ReplayRequest:
    """A logged request, as replay needs it."""

    prompt_ids: list[int]
    output_ids: list[int]
    params: SamplingParams  # temperature, top-k / top-p and max_new_tokens it was served with
    segment: str = "default"
    request_id: int | str | None = None


@dataclass
class ReplayStats:
    """Acceptance of one speculator on one request (floats: sampled requests are expected)."""

    steps: int = 0  # verification steps
    drafted_steps: int = 0  # of which proposed at least one draft
    draft_tokens: int = 0
    accepted: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)
    draft_s: float = 0.0  # seconds spent in the speculator's begin / commit / propose

    def observe(self, proposed: int, accepted_chain: Sequence[float],
                depth: int | None = None) -> None:
        """One step: ``accepted_chain[i]`` is P(draft i accepted) (0/1 for greedy);
        ``depth``: the deepest draft's position (a tree's; a chain's is ``proposed``)."""
        self.steps += 1
        self.drafted_steps += proposed > 0
        self.draft_tokens += proposed
        self.accepted += float(sum(accepted_chain))
        missing = (proposed if depth is None else depth) - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0.0] * missing)
        for i, a in enumerate(accepted_chain):
            self.accepted_per_position[i] += float(a)

    @property
    def tau(self) -> float | None:
        """Acceptance length, bonus included (:func:`autospec.engine.stats.tau`); None when
        the request had no step (an output of one token)."""
        return tau(self.accepted, self.steps)


def teacher_forced(target: Target, req: ReplayRequest,
                   layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits ``[n_out, vocab]`` predicting each output token, and features of every position.

    features: ``[n_prompt + n_out - 1, len(layers) * hidden]`` (the last token's is unused).
    """
    seq = torch.tensor(req.prompt_ids + req.output_ids[:-1], dtype=torch.long)
    out = target.forward(seq, target.new_cache(), feature_layers=layers,
                         logits_to_keep=len(req.output_ids))
    return out.logits, out.features


@torch.inference_mode()
def replay_request(target: Target | None, spec: Speculator, req: ReplayRequest, k: int,
                   tf: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                   compactable: bool | None = None) -> ReplayStats:
    """Replay one request with ``spec`` drafting ``k`` tokens per step (see module doc).
    ``compactable``: whether the target's cache can keep a tree's branch (read from
    ``target`` when not given; True without one), as the decode loop cuts trees to their
    first branch where it cannot (:meth:`Proposal.as_verified`)."""
    if not req.output_ids:
        return ReplayStats()
    out, n_prompt, params = req.output_ids, len(req.prompt_ids), req.params
    if tf is None and params.greedy and not spec.feature_layers:
        tf = (None, None)  # counted against the logged tokens alone: no target pass needed
    logits, feats = tf if tf is not None else teacher_forced(target, req, spec.feature_layers)
    # row j predicts out[j] after the logged out[:j]: the penalties count that prefix
    probs = None if params.greedy else \
        probs_from_logits(penalized(logits, params, (), out[:-1]), params)  # [n_out, vocab]
    stats = ReplayStats()
    device = _device(spec, logits, feats)
    # the live loop's generator lives on the target's device: so does replay's
    rng = None if params.greedy else torch.Generator(device=device).manual_seed(params.seed or 0)
    started = clock(device)  # the speculator's kernels are timed to their end, not launch
    spec.begin(torch.tensor(req.prompt_ids), feats[:n_prompt] if feats is not None else None)
    if compactable is None:
        compactable = target is None or target.new_cache().compactable
    pos, new = 0, 1  # `new` tokens out[pos:pos + new] were settled by the last step
    while pos + new < len(out):
        _commit(spec, out, pos, new, feats, n_prompt)
        pos += new
        k_eff = min(k, params.max_new_tokens - pos - 1)
        proposal = spec.propose(k_eff, params, rng) if k_eff > 0 else None
        if proposal is not None:
            proposal = proposal.as_verified(params, compactable)
        stats.draft_s += clock(device) - started
        if proposal is None or proposal.num_tokens == 0:
            chain: list[float] = []
        elif probs is None:  # the last logged token is the last step's own (module doc)
            chain = _greedy_chain(proposal, out[pos:-1])
        else:
            chain = _expected_chain(proposal, probs[pos:-1])
        if proposal is None:
            stats.observe(0, chain)
        else:
            stats.observe(proposal.num_tokens, chain, proposal.depth)
        new = 1 + (int(sum(chain)) if probs is None else round(sum(chain)))
        started = clock(device)
    return stats


def _device(spec: Speculator, logits: torch.Tensor | None,
            feats: torch.Tensor | None) -> torch.device:
    """Where the replay's tensors and the speculator's kernels live."""
    for t in (logits, feats):
        if t is not None:
            return t.device
    return torch.device(getattr(spec, "device", "cpu"))


def _commit(spec: Speculator, out: list[int], pos: int, new: int,
            feats: torch.Tensor | None, n_prompt: int) -> None:
    tokens = torch.tensor(out[pos : pos + new], dtype=torch.long)
    # out[j] is produced by sequence position n_prompt + j - 1
    f = feats[n_prompt + pos - 1 : n_prompt + pos + new - 1] if feats is not None else None
    spec.commit(tokens, f)


def _greedy_chain(proposal: Proposal, logged: list[int]) -> list[float]:
    """1.0 for each leading draft equal to the logged token, then stop (for a tree: along
    its deepest branch equal to the logged tokens)."""
    drafts = proposal.tokens
    if proposal.parents is not None:
        depths = [0, *proposal.depths()]  # of each verify row: the pending token, each draft
        choice = torch.tensor([logged[d] if d < len(logged) else -1 for d in depths],
                              device=drafts.device)
        return [1.0] * len(accept_tree(drafts, proposal.parents, choice))
    n = min(drafts.shape[0], len(logged))
    match = drafts[:n] == torch.tensor(logged[:n], dtype=torch.long, device=drafts.device)
    accepted = int(torch.cumprod(match, dim=0).sum()) if n else 0
    return [1.0] * accepted


def _expected_chain(proposal, p: torch.Tensor) -> list[float]:
    """P(draft i accepted) = Π_{j≤i} Σ_x min(p_j, q_j); p: ``[remaining, vocab]``."""
    n = min(proposal.num_tokens, p.shape[0])
    if n == 0:
        return []
    q = proposal.probs
    if q is None:  # deterministic proposer: q is one-hot, min(p, q) = p(draft)
        alpha = p[torch.arange(n, device=p.device), proposal.tokens[:n].to(p.device)]
    else:
        alpha = torch.minimum(p[:n], q[:n].to(p.device)).sum(-1)
    return torch.cumprod(alpha.clamp(0.0, 1.0), dim=0).tolist()


def replay(target: Target, speculators: dict[str, Speculator], requests: list[ReplayRequest],
           k: int, progress: Callable[[int], None] | None = None) -> dict[str, list[ReplayStats]]:
    """Replay every request with every speculator (same requests for all, one target pass
    per request shared by all of them); ``progress(n_done)`` after each request."""
    layers = tuple(sorted({layer for s in speculators.values() for layer in s.feature_layers}))
    results: dict[str, list[ReplayStats]] = {name: [] for name in speculators}
    compactable = target.new_cache().compactable
    for i, req in enumerate(requests):
        logits, feats = (teacher_forced(target, req, layers) if req.output_ids
                         else (None, None))
        for name, spec in speculators.items():
            tf = None
            if logits is not None:
                tf = (logits, _select(feats, layers, spec.feature_layers, target))
            results[name].append(replay_request(target, spec, req, k, tf, compactable))
        if progress is not None:
            progress(i + 1)
    return results


def _select(feats: torch.Tensor | None, have: tuple[int, ...], want: tuple[int, ...],
            target: Target) -> torch.Tensor | None:
    """The columns of ``feats`` (layers ``have``) for layers ``want``, in that order."""
    if not want or feats is None:
        return None
    h = target.info.hidden_size
    return torch.cat([feats[:, have.index(i) * h : (have.index(i) + 1) * h] for i in want], -1)

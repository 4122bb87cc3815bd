"""The speculative generate loop: propose, verify, commit.

One request at a time (batch size 1). Per step the speculator proposes up to ``k``
draft tokens; the target runs once over the pending token and the drafts; verification
keeps the accepted prefix plus one recovered/bonus token; the target's KV cache is
cropped to the accepted length (for a tree of drafts, the accepted branch's entries are
moved up first) and the speculator is told what was settled so it can
roll back its own state. With no speculator the same loop is plain target-only decoding.

The engine sees token ids; the target's tokenizer is used only to check stop strings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from autospec.engine.interface import check_fits
from autospec.engine.protocol import Proposal, Speculator
from autospec.engine.sampling import SamplingParams, biased, penalized, pick, probs_from_logits
from autospec.engine.stats import RequestStats
from autospec.engine.target import KVCache, Target
from autospec.engine.verify import greedy_tree_verify, greedy_verify, rejection_verify


@dataclass
class GenerationResult:
    token_ids: list[int]  # output tokens (EOS included when it ended the request)
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: RequestStats
    text: str | None = None  # decoded output, cut before a stop string; None without tokenizer


@dataclass
class Generation:
    """Iterate for the new token ids of each step; ``result`` is set when it is exhausted."""

    steps: Iterator[list[int]]
    result: GenerationResult | None = None

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.steps

    def close(self) -> None:
        """Stop decoding now: the steps not yet taken never run."""
        close = getattr(self.steps, "close", None)
        if close is not None:
            close()


class SpeculativeEngine:
    """Decodes with ``target``, drafting with ``speculator`` (None: target only): the
    ``native`` implementation of :class:`~autospec.engine.interface.Engine`."""

    name = "native"
    errored = False  # a native engine fails a request, never itself

    def __init__(self, target: Target, speculator: Speculator | None = None,
                 num_speculative_tokens: int = 5, *, version: str | None = None) -> None:
        if num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        self.target = target
        self.speculator = speculator
        self.k = num_speculative_tokens if speculator is not None else 0
        #: the version it drafts with (one for its life: a new version is a new engine)
        self.loaded: list[str] = [] if version is None else [version]

    def drafted_by(self, first: int) -> list[str]:
        return self.loaded[-1:]

    def retire(self) -> None:
        """Nothing to free: the target is the replica's, the speculator goes with the engine."""

    def close(self) -> None:
        """As :meth:`retire`: a native engine holds no process, thread or reserved memory."""

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        gen = self.stream(prompt_ids, params)
        for _ in gen:
            pass
        assert gen.result is not None
        return gen.result

    def stream(self, prompt_ids: list[int], params: SamplingParams,
               k: int | None = None) -> Generation:
        """``k``: draft at most this many tokens per step for this request (None: the
        engine's; 0: no drafting): a deployment's concurrency bands
        (:mod:`autospec.serve.bands`)."""
        self.check_request(prompt_ids, params)
        gen = Generation(steps=iter(()))
        gen.steps = self._steps(prompt_ids, params, gen, self.k if k is None else min(k, self.k))
        return gen

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        check_fits(prompt_ids, params, context=self.target.info.max_position_embeddings,
                   k=self.k, where="the target's")

    @torch.inference_mode()
    def _steps(self, prompt_ids: list[int], params: SamplingParams,
               gen: Generation, max_k: int) -> Iterator[list[int]]:
        started = time.perf_counter()
        spec, target = self.speculator, self.target
        rng = _generator(params, target.device)
        layers = spec.feature_layers if spec is not None else ()
        stats = RequestStats(prompt_tokens=len(prompt_ids))
        out_ids: list[int] = []
        stopper = _Stopper(target, params)

        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        cache = target.new_cache()
        out = target.forward(prompt, cache, feature_layers=layers, logits_to_keep=1)
        new = [int(pick(out.logits[-1], params, rng))]
        feats = out.features[-1:] if layers else None  # the position that produced `new`
        if spec is not None:
            spec.begin(prompt, out.features)
        stats.ttft_s = time.perf_counter() - started

        accepted: list[int] = []
        while True:
            new, finish = stopper.settle(out_ids, new)
            kept = max(0, min(len(accepted), len(new) - 1)) if finish else len(accepted)
            if kept < len(accepted):  # the output ended at one of the accepted drafts: the
                # drafts after it were never emitted, and the last token counts as the
                # step's own (the target's token there is the same), as replay counts it
                stats.uncount_accepted(len(accepted), kept)
            out_ids.extend(new)
            if new:
                yield new
            if finish:
                break
            # --- propose ---------------------------------------------------------
            k = min(max_k, params.max_new_tokens - len(out_ids) - 1)
            proposal = Proposal.empty()
            if spec is not None:
                spec.commit(torch.tensor(new, dtype=torch.long), feats)
                if k > 0:
                    proposal = spec.propose(k, params, rng)
                proposal = proposal.as_verified(params, cache.compactable)
            # --- verify: one target forward over the pending token and the drafts --
            accepted, nxt, feats = self._verify(new[-1], proposal, cache, params, rng, layers,
                                                out_ids)
            stats.observe_step(proposal.num_tokens, len(accepted), proposal.depth)
            new = [*accepted, nxt]

        stats.output_tokens = len(out_ids)
        stats.total_s = time.perf_counter() - started
        gen.result = GenerationResult(token_ids=out_ids, finish_reason=stopper.reason,
                                      stats=stats, text=stopper.text(out_ids))

    def _verify(self, pending: int, proposal: Proposal, cache: KVCache, params: SamplingParams,
                rng: torch.Generator | None, layers: tuple[int, ...],
                generated: Sequence[int] = (),
                ) -> tuple[list[int], int, torch.Tensor | None]:
        """Accepted drafts, the recovered/bonus token, and the features of the positions
        that produced them; the cache keeps exactly the settled positions. ``generated``:
        the request's output so far (penalties count it, and each row the drafts before
        it)."""
        start, device = cache.length, self.target.device
        # drafts arrive on the host; one copy puts them beside the logits they meet
        inp = torch.cat([torch.tensor([pending]), proposal.tokens.cpu()]).to(device)  # [k' + 1]
        drafts = inp[1:]  # [k'] on the target's device
        out = self.target.forward(inp, cache, feature_layers=layers,
                                  tree_parents=proposal.parents)
        logits = penalized(out.logits, params, generated, proposal.tokens.tolist())
        if proposal.is_tree:  # never penalized: trees are cut to a chain then
            path, nxt = greedy_tree_verify(proposal.tokens, proposal.parents,
                                           biased(logits, params))
        elif params.greedy:
            n, nxt = greedy_verify(drafts, biased(logits, params))
            path = list(range(n))
        else:
            p = probs_from_logits(logits, params)  # [k' + 1, vocab]
            q = proposal.probs.to(device) if proposal.probs is not None else None
            n, nxt = rejection_verify(drafts, q, p, rng)
            path = list(range(n))
        rows = [0, *(i + 1 for i in path)]  # input rows that produced the settled tokens
        cache.keep(start, rows)  # drop the rejected drafts from the target's cache
        feats = out.features[rows] if layers else None
        return proposal.tokens.cpu()[path].tolist(), nxt, feats


def _generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's random stream, on the device of the distributions it samples from
    (``torch.multinomial`` on CUDA refuses a CPU generator); a fixed seed reproduces a
    request on the same device."""
    if params.greedy:
        return None
    rng = torch.Generator(device=device)
    rng.manual_seed(params.seed if params.seed is not None else torch.seed())
    return rng


_STOP_WINDOW = 32  # tokens of output decoded first for the stop check


class _Stopper:
    """Cuts the settled tokens at EOS, max_new_tokens or a stop string."""

    def __init__(self, target: Target, params: SamplingParams) -> None:
        self.params = params
        self.eos = set() if params.ignore_eos else set(target.info.eos_token_ids)
        self.tokenizer = target.tokenizer
        self.reason = "length"
        self.longest = max((len(s) for s in params.stop), default=0)

    def settle(self, so_far: list[int], new: list[int]) -> tuple[list[int], bool]:
        """The part of ``new`` to emit, and whether the request is finished."""
        room = self.params.max_new_tokens - len(so_far)
        for i, tok in enumerate(new[:room]):
            if tok in self.eos:
                self.reason = "stop"
                return new[: i + 1], True
            if self.params.stop and self._hits_stop(so_far, new[: i + 1]):
                self.reason = "stop"
                return new[: i + 1], True
        if len(new) >= room:
            return new[:room], True
        return new, False

    def _hits_stop(self, so_far: list[int], new: list[int]) -> bool:
        """Whether a stop string ends in the text of ``new[-1]``: the decoded tail of the
        output must hold the longest stop string and the newest token's text, plus a few
        characters for a multi-byte character cut at the tail's start. The tail starts at
        ``_STOP_WINDOW`` tokens and doubles while it holds too little text (special tokens
        decode to none), so the cost per token follows the stop strings' length."""
        if self.tokenizer is None:
            return False
        decode = self.tokenizer.decode
        need = self.longest + len(decode(new[-1:], skip_special_tokens=True)) + 4
        total, window = len(so_far) + len(new), _STOP_WINDOW
        while True:
            start = max(0, total - window)
            ids = so_far[start:] + new if start < len(so_far) else new[start - len(so_far) :]
            tail = decode(ids, skip_special_tokens=True)
            if len(tail) >= need or start == 0:
                return any(s in tail for s in self.params.stop)
            window *= 2

    def text(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in self.params.stop if s in text]
        return text[: min(cuts)] if cuts else text

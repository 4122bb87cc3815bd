"""Measured speedup over target-only decoding, on this machine, with its load cancelled out.

The estimate of :func:`autospec.evaluate.compare.estimated_speedup` multiplies τ by a cost
model; this module **decodes** instead. A **round** decodes one held-out prompt greedily
(the native engine, the evaluation's ``k``, ``max_tokens`` new tokens) with the target
alone and with each version, back to back, the order reversed every other round so that a
load rising or falling during a round weighs on both sides alike. A version's **ratio** in
a round is its tokens/s after the first token over the target-only tokens/s after the first
token of that same round (the prompt's prefill, which speculation does not change, left
out: see below); its **decoded speedup** is the median of its ratios over all rounds
(``prompts × repeats``). Load that
slows a whole round slows both sides and divides out; a burst that hits one decode moves
one ratio, which the median ignores.

Decoding is greedy, so a version's output is the target-only output (token for token, up
to bfloat16 near-ties): both sides of a ratio produce the same tokens, and the ratio is a
ratio of seconds.

**Step cost, and the speedup the gate uses.** A round's ratio is that round's τ over the
cost of one speculative step in target-only tokens' time. A few prompts of 32 tokens give
a noisy τ: in one demo run the gate's 4 decoded prompts put suffix at 1.44× where the next
phase realised 1.01× — those prompts' τ was 2.1, the replay over all 15 held-out requests
1.70. So each round also yields the version's **step cost** (its τ in that round over its
ratio; the median is kept in ``step_cost``), and the speedup the gate compares is
:meth:`SpeedMeasurement.projected`: τ replayed over every held-out request ÷ the measured
step cost. The decoded medians stay in ``speedup``.

**A step's cost grows with what it drafts.** A speculative step verifies its ``d`` drafts and
the token after them, and its proposer drafts them: its cost in target-only tokens' time is
``1 + c·d``, ``c`` the cost of one drafted token. An EAGLE head drafts ``k`` every step, so
one step cost stands for all prompts. An index (suffix, n-gram) drafts as much as it matches,
and the prompts it matches best are those where it drafts most: on vLLM the speed prompts of
one cycle had τ 3.45 where the held-out set had 2.12, their steps cost 2.15 target-only
tokens, and τ 2.12 ÷ 2.15 read 0.98× for a version whose decodes ran 1.60× (2026-12-05).
So each round also yields ``c`` (its step cost − 1, over its drafts per step; the median is
kept in ``draft_cost``), and :meth:`SpeedMeasurement.projected` prices a step at the drafts
per step the replay counted over every held-out request: ``τ ÷ (1 + c·d)``. For a version
that drafts the same number every step that is the measured step cost, unchanged. A step
costs at least one target-only token (:data:`MIN_STEP_COST`), so no projection exceeds τ.

**After the first token.** A decode's time holds its prompt's prefill, the same for every
side. Counted in, it pulls every ratio towards 1 by a share that grows with τ, and the step
cost read from it is no longer a step's: on vLLM the prefill was 22-37 % of a round of 32
tokens at 4 requests in flight (2026-12-05). The canary's realised speed and the ledger time
live requests after their first token too (latency − TTFT). So ratios are of tokens/s after
the first token; a round where a side emitted fewer than two tokens falls back to whole
decodes.

One warm-up decode per side comes first, untimed (allocator and kernel first-call costs).

**Threads.** On a CPU the decodes run on as many torch threads as the serving replicas
decode on (``threads``: the deployment's recorded count, :mod:`autospec.numerics`), not on
the controller's: a verify of k+1 tokens is compute-bound where a 1-token step is
memory-bound, so the step cost depends on the thread count (the demo's SmolLM2 float32
versions read 4–8 % faster against target-only on 2 threads than on the replicas' 1, and
with another process busy on one of the 2 cores an eagle3 head read 0.99× on 2 threads
against 0.81× on 1). A controller runs them within its cap on torch threads
(:mod:`autospec.threads`;
:meth:`~autospec.evaluate.speed_settings.SpeedSettings.within`): on fewer threads than the
replicas when they record more than the cap, and the measurement records the count it ran
on.

Knows nothing of the store or the gate: it takes a target, speculators and token ids.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from autospec.engine.clock import clock
from autospec.engine.generate import SpeculativeEngine
from autospec.engine.protocol import Speculator
from autospec.engine.sampling import SamplingParams
from autospec.engine.target import Target

TARGET_ONLY = "target-only"

#: A speculative step runs the target at least once, so it costs at least one target-only
#: token's time. Timing noise on short decodes can read less: a round faster than its τ
#: allows gives a step cost below 1 and a negative cost per draft, and priced at the replay's
#: larger drafts per step, ``1 + c·d`` came near 0 and an n-gram index of τ 1.02 read 105.82×
#: (CI, 2026-12-05, a tiny random-init target). Costs are floored here, so a projection
#: never exceeds its τ.
MIN_STEP_COST = 1.0


@dataclass
class SpeedMeasurement:
    """Measured speedup of each version over target-only decoding."""

    speedup: dict[str, float]  # version -> median over rounds of its per-round ratio
    ratios: dict[str, list[float]]  # version -> ratio of each round, in round order
    tokens_per_s: dict[str, float]  # version (and "target-only") -> median tokens/s
    rounds: int
    prompts: int
    repeats: int
    max_tokens: int
    k: int
    spread: dict[str, list[float]] = field(default_factory=dict)  # version -> [q25, q75]
    threads: int = 0  # torch threads the decodes ran on
    # version -> median over rounds of a speculative step's seconds in target-only tokens'
    # seconds (that round's τ over its ratio): what τ buys is τ / step_cost
    step_cost: dict[str, float] = field(default_factory=dict)
    #: where it was measured: autospec's engine one request at a time (``native``, 1), or
    #: vLLM with ``concurrency`` requests decoded at once (:mod:`autospec.evaluate.speed_vllm`)
    engine: str = "native"
    concurrency: int = 1
    #: target-only tokens/s after the first token (median over rounds of (tokens − 1) ÷
    #: (seconds − TTFT); on vLLM the batch's tokens after each request's first over the
    #: seconds after the last first token): the rate the ledger divides by, since the rows
    #: it accounts are timed the same way (None: not measured)
    decode_tokens_per_s: float | None = None
    #: version -> median over rounds of one drafted token's cost in target-only tokens'
    #: time ((step cost − 1) ÷ drafts per step, of the rounds that drafted): see module doc
    draft_cost: dict[str, float] = field(default_factory=dict)
    #: version -> median over rounds of draft tokens per step in the decodes measured
    drafts_per_step: dict[str, float] = field(default_factory=dict)

    def step_cost_at(self, version: str, drafts: float | None) -> float | None:
        """A step's cost for ``version`` drafting ``drafts`` tokens a step: ``1 + c·d`` where a
        draft cost was measured and ``drafts`` is known, else the measured median step cost
        (None: none measured); never below 1, see :data:`MIN_STEP_COST`."""
        c = self.draft_cost.get(version)
        if c is not None and drafts is not None:
            return max(MIN_STEP_COST, 1.0 + c * drafts)
        cost = self.step_cost.get(version)
        return max(MIN_STEP_COST, cost) if cost else None

    def projected(self, tau: Mapping[str, float | None],
                  drafts: Mapping[str, float] | None = None) -> dict[str, float]:
        """Speedup per version from ``tau`` and ``drafts`` (τ and draft tokens per step
        replayed over every held-out request) and the costs measured here: τ over
        :meth:`step_cost_at`; the decoded median where no step cost was measured or no τ
        was replayed (None)."""
        drafts = drafts or {}
        return {v: t / c if (c := self.step_cost_at(v, drafts.get(v))) is not None
                and (t := tau[v]) is not None else self.speedup[v] for v in self.speedup}


class Decoded(NamedTuple):
    """One side's decode in a round: output tokens/s, τ (None: no step), draft tokens per
    step (None: no step, or not counted), and tokens/s after the first token (None: fewer
    than two tokens, or not timed)."""

    rate: float
    tau: float | None
    drafts: float | None = None
    after_first: float | None = None

    def ratio(self, base: Decoded) -> float:
        """This side's rate over ``base``'s: after the first token where both were timed
        so, else whole decodes (0 when ``base`` decoded nothing)."""
        if self.after_first and base.after_first:
            return self.after_first / base.after_first
        return self.rate / base.rate if base.rate > 0 else 0.0


def spread_prompts(prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """``n`` prompts evenly spaced over ``prompts`` (all of them when there are fewer)."""
    usable = [p for p in prompts if p]
    if len(usable) <= n:
        return list(usable)
    step = len(usable) / n
    return [usable[int(i * step)] for i in range(n)]


def _decode_rates(engine: SpeculativeEngine, prompt: list[int],
                  params: SamplingParams) -> Decoded:
    """One greedy decode, timed to the device's end: output tokens per second,
    ``RequestStats.tau`` (1 for the target alone, None without a step), draft tokens per
    step, and tokens per second after the first token (None with fewer than two)."""
    device = engine.target.device
    started = clock(device)
    result = engine.generate(prompt, params)
    seconds = clock(device) - started
    stats = result.stats
    rate = stats.output_tokens / seconds if seconds > 0 else 0.0
    decoding = seconds - stats.ttft_s
    after = ((stats.output_tokens - 1) / decoding
             if stats.output_tokens > 1 and decoding > 0 else None)
    return Decoded(rate, stats.tau, stats.drafts_per_step, after)


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[2]]


def measure_speedups(target: Target, speculators: Mapping[str, Speculator],
                     prompts: Sequence[list[int]], *, k: int, max_tokens: int = 32,
                     repeats: int = 2,
                     progress: Callable[[int, int], None] | None = None) -> SpeedMeasurement:
    """Interleaved target-only vs speculative decodes of ``prompts`` (see the module doc);
    ``progress(done, total)`` after each round."""
    if not prompts:
        raise ValueError("no prompts to measure the speedup on")
    if TARGET_ONLY in speculators:
        raise ValueError(f"{TARGET_ONLY!r} names the baseline; rename that version")
    params = SamplingParams(max_new_tokens=max_tokens)
    limit = target.info.max_position_embeddings - max_tokens - k - 1
    prompts = [p[-limit:] for p in prompts]  # keep the longest tail that fits
    engines = {TARGET_ONLY: SpeculativeEngine(target)}
    engines |= {v: SpeculativeEngine(target, s, k) for v, s in speculators.items()}
    for engine in engines.values():  # warm-up, untimed
        engine.generate(prompts[0], SamplingParams(max_new_tokens=min(8, max_tokens)))
    total = len(prompts) * repeats

    def decode(r: int, name: str) -> Decoded:
        return _decode_rates(engines[name], prompts[r % len(prompts)], params)

    decodes = interleaved(list(engines), total, decode, progress)
    return summarize(decodes, list(speculators), rounds=total, prompts=len(prompts),
                     repeats=repeats, max_tokens=max_tokens, k=k,
                     threads=torch.get_num_threads())


def interleaved(names: list[str], total: int, decode: Callable[[int, str], Decoded],
                progress: Callable[[int, int], None] | None = None
                ) -> dict[str, list[Decoded]]:
    """Each side's decode per round: ``total`` rounds, each decoding every side in turn
    (``decode(round, name)``), the order reversed every other round; ``progress(done,
    total)`` after each round."""
    decodes: dict[str, list[Decoded]] = {name: [] for name in names}
    for r in range(total):
        for name in names if r % 2 == 0 else list(reversed(names)):
            decodes[name].append(decode(r, name))
        if progress is not None:
            progress(r + 1, total)
    return decodes


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(decodes: Mapping[str, Sequence[Decoded]], versions: list[str],
              **fields: Any) -> SpeedMeasurement:
    """The :class:`SpeedMeasurement` of interleaved rounds (each side's decodes,
    :data:`TARGET_ONLY` among them): each version's ratio to target-only per round
    (:meth:`Decoded.ratio`), their median, the step costs (of the rounds that had a τ) and
    draft costs (of those that drafted), target-only's rate after the first token;
    ``fields``: the measurement's other fields."""
    base = decodes[TARGET_ONLY]
    ratios = {v: [d.ratio(b) for d, b in zip(decodes[v], base, strict=True)]
              for v in versions}
    costs = {v: [(d.tau / q, d.drafts) for d, q in zip(decodes[v], ratios[v], strict=True)
                 if q > 0 and d.tau is not None]
             for v in versions}
    draft_cost = {v: c for v in versions
                  if (c := _median([(s - 1.0) / d for s, d in costs[v] if d])) is not None}
    drafts = {v: m for v in versions
              if (m := _median([d.drafts for d in decodes[v] if d.drafts is not None]))
              is not None}
    return SpeedMeasurement(
        speedup={v: statistics.median(r) for v, r in ratios.items()}, ratios=ratios,
        step_cost={v: _median([s for s, _ in c]) or 0.0 for v, c in costs.items()},
        draft_cost=draft_cost, drafts_per_step=drafts,
        tokens_per_s={name: statistics.median(d.rate for d in ds)
                      for name, ds in decodes.items()},
        decode_tokens_per_s=_median([d.after_first for d in base if d.after_first]),
        spread={v: _quartiles(r) for v, r in ratios.items()}, **fields)

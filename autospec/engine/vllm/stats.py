"""vLLM's per-request figures in autospec's terms, and vLLM's own Prometheus series.

:func:`vllm_stats` turns vLLM's per-request acceptance summary
(``per_request_spec_decode_metrics="summary"``) into autospec's :class:`RequestStats` (the
traffic row's and the response's acceptance fields). vLLM's summary is a histogram of accepted
drafts per verify step that had drafts; autospec's per-position counts follow from it
(position i accepted in every step that accepted more than i drafts), and its step count
(every verify step, drafts or not, as autospec's engine and replay count) from the output
length. vLLM counts a last step's drafts accepted past ``max_tokens`` or a stop and then
cuts them from the output; autospec counts only what was emitted, and a request's last token
as its step's own, never as an accepted draft (a stop token accepted as a draft included:
the target's own token there is the same), so ``output tokens = 1 + steps + accepted``
holds for every request and the accepted count is clipped to what it allows (see
docs/vllm.md, "Same proposals"). The clip is exact when every step drafted (an EAGLE head's);
with steps that drafted nothing (an n-gram that found no match, or a grammar that refused a
step's first draft) it is only a bound, which is why the engines autospec starts draft no
further than the request can go and leave stop tokens to the target
(:mod:`autospec.interop.vllm_request_end`): their counts need no clip.
"""

from __future__ import annotations

import time
from typing import Any

from autospec.engine.stats import RequestStats


def first_token_s(output: Any, arrived: float, observed: float) -> float:
    """Seconds from ``arrived`` (``time.perf_counter()``) to the request's first token.

    ``observed`` is when the request's first output reached the caller. That is the first
    token when vLLM sends an output per step (a stream, or autospec's own decoder). A request
    that does not stream gets only its final output (``RequestOutputKind.FINAL_ONLY``), and
    then ``observed`` is the end of the request: its row would show no decode time, and the
    canary's realised speed and the ledger, which divide tokens by latency − TTFT, would read
    nonsense (2026-12-05: 290,000 tokens/s "live decode" in the vLLM demo). vLLM keeps its
    own record (``RequestOutput.metrics``, with stats logging on, as in every engine autospec
    starts): the request's arrival (wall clock) and its first token's latency from there.
    That gives the first token's time, which is never later than ``observed``. Without the
    record, ``observed`` is returned."""
    stats = getattr(output, "metrics", None)
    arrival = getattr(stats, "arrival_time", 0.0) or 0.0
    latency = getattr(stats, "first_token_latency", 0.0) or 0.0
    if not (isinstance(arrival, int | float) and isinstance(latency, int | float)) \
            or arrival <= 0 or latency <= 0:
        return observed
    first = time.perf_counter() - (time.time() - (arrival + latency))
    return min(max(first - arrived, 0.0), observed)


class VllmMetricsCollector:
    """A Prometheus collector of vLLM's own series (``vllm:*``, ``vllm:spec_decode_*``
    included) from the process's default registry, where vLLM's engine registers them;
    registered in the replica's registry, so its ``/metrics`` carries them. vLLM registers
    its series anew for each engine it starts: after a swap they count from zero."""

    def describe(self) -> list[Any]:
        return []  # nothing to check for duplicates: these names are vLLM's

    def collect(self) -> Any:
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


def vllm_stats(output: Any, *, prompt_tokens: int, k: int, ttft_s: float,
               total_s: float) -> RequestStats:
    """autospec's :class:`RequestStats` for a finished vLLM completion (``output``: its
    ``CompletionOutput``), from vLLM's per-request ``spec_decode_metrics`` (see module doc).

    As autospec's engine counts them: ``num_drafts`` is every verify step (target forward
    after the prompt), with or without drafts — vLLM's histogram counts only the steps that
    had drafts (an n-gram that found no match drafts nothing) — and accepted drafts are
    those emitted. Each step emits its accepted drafts + 1 and the prompt's forward 1, so
    ``output tokens = 1 + steps + accepted``."""
    n_out = len(output.token_ids)
    stats = RequestStats(prompt_tokens=prompt_tokens, output_tokens=n_out, ttft_s=ttft_s,
                         total_s=total_s, num_drafts=max(0, n_out - 1))
    metrics = getattr(output, "spec_decode_metrics", None)
    if metrics is None or not k:
        return stats
    histogram = list(metrics.histogram)
    drafted_steps = sum(histogram)
    reported = sum(j * count for j, count in enumerate(histogram))
    # every step emits its accepted drafts + 1, the last one's last token its own
    accepted = min(reported, max(0, n_out - 1 - drafted_steps))  # cut from output
    excess = reported - accepted
    per_position = [sum(histogram[j] for j in range(i + 1, len(histogram))) for i in range(k)]
    while excess > 0 and any(per_position):  # take the excess from the deepest first
        deepest = max(i for i, n in enumerate(per_position) if n)
        per_position[deepest] -= 1
        excess -= 1
    stats.num_drafts = max(drafted_steps, n_out - 1 - accepted)
    stats.num_draft_tokens = int(metrics.num_draft_tokens)
    stats.num_accepted_tokens = accepted
    stats.accepted_per_position = per_position
    return stats


def reported_summary(output: Any) -> dict[str, Any] | None:
    """vLLM's per-request metrics as it reports them (``to_dict``), or None."""
    metrics = getattr(output, "spec_decode_metrics", None)
    return None if metrics is None else metrics.to_dict()


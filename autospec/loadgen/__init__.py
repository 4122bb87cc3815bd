"""Traffic generator: OpenAI-API load of chosen domains against a running deployment.

- :mod:`~autospec.loadgen.mix` — domain mixes and schedules that shift them over time;
- :mod:`~autospec.loadgen.source` — prompts from :mod:`autospec.workloads` or a JSONL replay;
- :mod:`~autospec.loadgen.client` — one request through the ``openai`` client, measured
  (latency, tokens, the response's ``autospec`` acceptance statistics);
- :mod:`~autospec.loadgen.runner` — the bounded load loop (concurrency, rate, requests,
  duration) and :func:`~autospec.loadgen.runner.summarize`;
- :mod:`~autospec.loadgen.cli` — ``autospec loadgen``.

It talks to a deployment only over HTTP; it knows nothing of models, Ray or the store.
"""

from autospec.loadgen.client import Driver, Result
from autospec.loadgen.mix import MixError, Schedule, parse_mix, parse_schedule
from autospec.loadgen.runner import LoadSpec, run_load, summarize, tau
from autospec.loadgen.source import DomainSource, Prompt, ReplaySource, SourceError

__all__ = [
    "DomainSource",
    "Driver",
    "LoadSpec",
    "MixError",
    "Prompt",
    "ReplaySource",
    "Result",
    "Schedule",
    "SourceError",
    "parse_mix",
    "parse_schedule",
    "run_load",
    "summarize",
    "tau",
]

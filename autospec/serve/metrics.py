"""Prometheus metrics of a serving replica, with vLLM-like names and meanings.

Reporter only: every figure is read from a request's
:class:`~autospec.engine.stats.RequestStats` (τ is defined there), labelled by the
speculator ``version`` that served it. Exposed by ``GET /metrics`` of the replica that
answers, from a registry of its own (``prometheus_client``), so tests and several servers in
one process never collide. Under Ray Serve every replica also sends its exposition to the
application's metrics hub (:mod:`autospec.serve.metrics_hub`), and ``GET /metrics`` on any
replica answers :func:`merge_expositions` of all of them: one scrape covers the deployment,
each series labelled ``replica``, names unchanged (see ``ops/README-serve.md``).

| metric | type | meaning |
|---|---|---|
| ``autospec:spec_decode_num_drafts_total`` | counter | verification steps |
| ``autospec:spec_decode_num_draft_tokens_total`` | counter | draft tokens proposed |
| ``autospec:spec_decode_num_accepted_tokens_total`` | counter | draft tokens accepted |
| ``autospec:spec_decode_num_accepted_tokens_per_pos_total{position}`` | counter | per pos. |
| ``autospec:spec_decode_acceptance_length`` | histogram | τ per request (bonus included) |
| ``autospec:request_latency_seconds`` | histogram | arrival to last token |
| ``autospec:time_to_first_token_seconds`` | histogram | arrival to first token (queue included) |
| ``autospec:request_generation_tokens_per_second`` | histogram | output tokens / decode time |
| ``autospec:generation_tokens_total`` / ``autospec:prompt_tokens_total`` | counter | tokens |
| ``autospec:request_success_total{finish_reason}`` | counter | finished requests |
| ``autospec:request_rejected_total{reason}`` | counter | 503: ``pending_limit``/``queue_wait`` |
| ``autospec:request_abandoned_total{stage}`` | counter | client gone: ``waiting``/``decoding`` |
| ``autospec:num_requests_running`` / ``..._waiting`` | gauge | decode thread |
| ``autospec:speculator_info{version,kind}`` | gauge | 1 for the version serving now |
| ``autospec:speculator_load_failures_total`` | counter | versions that failed to load |

The traffic writer's own counters (``autospec_traffic_rows_total{outcome}``...) are added by
:func:`autospec.store.register_prometheus`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from autospec.engine.stats import RequestStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
_TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class ServeMetrics:
    """The metrics of one server; ``observe_request`` reads one finished request's stats."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, v = self.registry, ["version"]
        self.num_drafts = Counter("autospec:spec_decode_num_drafts",
                                  "Verification steps (target forwards after the prompt).",
                                  v, registry=r)
        self.num_draft_tokens = Counter("autospec:spec_decode_num_draft_tokens",
                                        "Draft tokens proposed.", v, registry=r)
        self.num_accepted = Counter("autospec:spec_decode_num_accepted_tokens",
                                    "Draft tokens accepted.", v, registry=r)
        self.accepted_per_pos = Counter("autospec:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position.",
                                        ["version", "position"], registry=r)
        self.tau = Histogram("autospec:spec_decode_acceptance_length",
                             "Acceptance length τ per request (mean accepted + 1 per step).",
                             v, buckets=_TAU_BUCKETS, registry=r)
        self.latency = Histogram("autospec:request_latency_seconds",
                                 "Request latency, arrival to last token.", ["version", "route"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("autospec:time_to_first_token_seconds",
                              "Arrival to first token, queueing included.", ["version", "route"],
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tokens_per_s = Histogram("autospec:request_generation_tokens_per_second",
                                      "Output tokens per second of decoding, per request.", v,
                                      buckets=_TPS_BUCKETS, registry=r)
        self.generation_tokens = Counter("autospec:generation_tokens",
                                         "Output tokens generated.", v, registry=r)
        self.prompt_tokens = Counter("autospec:prompt_tokens", "Prompt tokens processed.", v,
                                     registry=r)
        self.success = Counter("autospec:request_success", "Finished requests.",
                               ["version", "finish_reason"], registry=r)
        self.rejected = Counter("autospec:request_rejected", "Requests refused for overload.",
                                ["reason"], registry=r)
        self.abandoned = Counter("autospec:request_abandoned",
                                 "Requests whose client left before the answer (not logged).",
                                 ["stage"], registry=r)
        self.running = Gauge("autospec:num_requests_running", "Requests decoding now.",
                             registry=r)
        self.waiting = Gauge("autospec:num_requests_waiting",
                             "Requests admitted and waiting for the decode thread.", registry=r)
        self.speculator_info = Gauge("autospec:speculator_info",
                                     "1 for the speculator version serving new requests.",
                                     ["version", "kind"], registry=r)
        self.load_failures = Counter("autospec:speculator_load_failures",
                                     "Speculator versions that failed to load.", registry=r)

    def observe_request(self, *, version: str, route: str, stats: RequestStats,
                        latency_s: float, ttft_s: float, finish_reason: str) -> None:
        self.num_drafts.labels(version).inc(stats.num_drafts)
        self.num_draft_tokens.labels(version).inc(stats.num_draft_tokens)
        self.num_accepted.labels(version).inc(stats.num_accepted_tokens)
        for pos, n in enumerate(stats.accepted_per_position):
            self.accepted_per_pos.labels(version, str(pos)).inc(n)
        if stats.num_drafts:
            self.tau.labels(version).observe(stats.tau)
        self.latency.labels(version, route).observe(latency_s)
        self.ttft.labels(version, route).observe(ttft_s)
        if stats.total_s > 0:
            self.tokens_per_s.labels(version).observe(stats.tokens_per_s)
        self.generation_tokens.labels(version).inc(stats.output_tokens)
        self.prompt_tokens.labels(version).inc(stats.prompt_tokens)
        self.success.labels(version, finish_reason).inc()

    def set_version(self, version: str, kind: str, previous: str | None = None,
                    previous_kind: str | None = None) -> None:
        if previous is not None and previous_kind is not None:
            self.speculator_info.labels(previous, previous_kind).set(0)
        self.speculator_info.labels(version, kind).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def merge_expositions(texts: Mapping[str, str]) -> bytes:
    """One Prometheus exposition from several replicas' (``{replica: text}``): every sample
    gains the label ``replica``; names, types and help are kept."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            out = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type,
                                                       fam.unit))
            out.samples.extend(Sample(s.name, {**s.labels, "replica": replica}, s.value,
                                      s.timestamp, s.exemplar) for s in fam.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector of given metric families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families

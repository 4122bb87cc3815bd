"""One scrape for the deployment: replicas' expositions merged, labelled, names unchanged."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from autospec.engine.stats import RequestStats
from autospec.serve.metrics import ServeMetrics, merge_expositions


def _replica(tokens: int) -> ServeMetrics:
    m = ServeMetrics()
    stats = RequestStats(prompt_tokens=3)
    stats.output_tokens = tokens
    m.observe_request(version="v1", route="completions", stats=stats, latency_s=0.5,
                      ttft_s=0.1, finish_reason="length")
    m.waiting.inc()
    return m


def test_merged_exposition_has_every_replicas_series_under_the_same_names():
    a, b = _replica(7), _replica(11)
    merged = merge_expositions({"r1": a.exposition().decode(), "r2": b.exposition().decode()})
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    tokens = {s.labels["replica"]: s.value for s in
              families["autospec:generation_tokens"].samples if s.name.endswith("_total")}
    assert tokens == {"r1": 7.0, "r2": 11.0}
    waiting = {s.labels["replica"]: s.value
               for s in families["autospec:num_requests_waiting"].samples}
    assert waiting == {"r1": 1.0, "r2": 1.0}
    text = merged.decode()
    assert 'autospec:generation_tokens_total{replica="r2",version="v1"} 11.0' in text
    assert "# TYPE autospec:request_latency_seconds histogram" in text
    assert 'autospec:request_latency_seconds_bucket{le="+Inf",replica="r1",route="completions"' \
        in text
    # every family of one replica's exposition is in the merged one
    single = {f.name for f in text_string_to_metric_families(a.exposition().decode())}
    assert single <= set(families)

"""The metrics hub takes a push from every replica every two seconds; Serve's access log
would print each ("CALL put OK") into `autospec serve`'s output for as long as it runs."""

from autospec.serve.metrics_hub import PUSH_INTERVAL_S, MetricsHub


def test_the_hub_writes_no_access_log_line_per_push():
    assert PUSH_INTERVAL_S <= 5
    assert MetricsHub.logging_config["enable_access_log"] is False

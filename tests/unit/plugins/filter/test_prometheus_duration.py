"""Unit tests for kvcache.offload.prometheus_duration (Prometheus's model.ParseDuration rules)."""
import pytest

from ansible_collections.kvcache.offload.plugins.filter.prometheus_duration import FilterModule, prometheus_duration


@pytest.mark.parametrize("text, seconds", [
    ("15s", 15.0), ("1m", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("1d", 86400.0),
    ("1w", 604800.0), ("1y", 31536000.0), ("1h2m3s4ms", 3723.004), ("0", 0.0), ("0s", 0.0),
])
def test_durations_prometheus_accepts(text, seconds):
    assert prometheus_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "1.5m", "s15", "1m1h", "15 s", "15S", "-1s", "1s1s", None, "fast"])
def test_durations_prometheus_refuses(text):
    assert prometheus_duration(text) is None


def test_the_filter_is_registered():
    assert FilterModule().filters()["prometheus_duration"] is prometheus_duration

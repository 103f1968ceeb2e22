"""Unit tests for scripts/bench_storage.py helpers (no network, no subprocess services)."""
import pytest

import bench_storage


def test_throughput_and_percentile():
    got = bench_storage.throughput(4, 4 * 32 * 1024 * 1024, 2.0, [0.1, 0.2, 0.3, 0.4])
    assert got["mb_per_s"] == pytest.approx(4 * 33.554432 / 2)
    assert got["ops_per_s"] == 2.0
    assert got["latency_p50_ms"] in (200.0, 300.0)
    assert bench_storage.throughput(0, 0, 1.0, [])["mb_per_s"] is None
    assert bench_storage.percentile([], 50) is None


def test_storage_ratios():
    tiers = {"s3": {"plain_client": "boto3",
                    "plain": {"runs": [{"streams": 1, "put": {"mb_per_s": 100.0}, "get": {"mb_per_s": 400.0}}]},
                    "lmcache": {"runs": [{"streams": 1, "put": {"mb_per_s": 50.0}, "get": {"mb_per_s": 600.0}}]}},
             "fs": {"plain_client": "file", "plain": {"runs": [{"streams": 8, "put": {"mb_per_s": 10.0},
                                                                "get": {"mb_per_s": 20.0}}]}}}
    got = {(r["tier"], r["op"], r["streams"]): r for r in bench_storage.storage_ratios(tiers)}
    assert got[("s3", "put", 1)]["lmcache_over_plain"] == 0.5
    assert got[("s3", "get", 1)]["lmcache_over_plain"] == 1.5
    assert got[("fs", "get", 8)]["lmcache_over_plain"] is None  # LMCache not measured

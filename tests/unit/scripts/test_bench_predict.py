"""Unit tests for scripts/bench_predict.py: measured tiers x the prefill table."""
import pytest

import bench_common
import bench_predict


def test_measured_tiers_prefers_lmcache_at_most_streams():
    storage = {"tiers": {"s3": {"plain_client": "boto3", "lmcache": {"runs": [
        {"streams": 1, "get": {"mb_per_s": 100.0, "bytes": 800, "objects": 8}},
        {"streams": 8, "get": {"mb_per_s": 300.0, "bytes": 800, "objects": 8}}]},
        "plain": {"runs": [{"streams": 8, "get": {"mb_per_s": 999.0, "bytes": 800, "objects": 8}}]}}}}
    tiers = bench_predict.measured_tiers(storage)
    assert [t["name"] for t in tiers] == ["s3/lmcache"]
    assert tiers[0]["bytes_per_s"] == 300e6


def test_predict_rows_use_the_filter():
    reference = bench_common.load_reference()
    rows = bench_predict.predict(reference, [{"name": "slow", "bytes_per_s": 1e9}], [4096])
    assert len(rows) == len(reference["prefill_rates"])
    row = [r for r in rows if r["model"] == "Llama-3.1-8B" and r["gpu"] == "H100"][0]
    # 131072 B/token x 4096 tokens = 512 MiB; at 1 GB/s 0.537 s; recompute 4096 / 32908 = 0.124 s
    assert row["kv_bytes"] == 131072 * 4096
    assert row["prefill_tokens_per_s"] == pytest.approx(32908, abs=1)
    assert row["tiers"]["slow"]["load_seconds"] == pytest.approx(0.536870912)
    assert row["tiers"]["slow"]["load_wins"] is False
    # PCIe Gen5 nominal 64 GB/s: 8.4 ms, loading wins ~14.8x
    assert row["tiers"]["cpu_ram_pcie_nominal"]["load_wins"] is True
    assert row["break_even_bandwidth"] == pytest.approx(131072 * 32908, rel=1e-4)

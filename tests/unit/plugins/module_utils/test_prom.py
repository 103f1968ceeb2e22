from __future__ import annotations

import os

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import prom

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "metrics")


def page(name):
    with open(os.path.join(FIX, name)) as handle:
        return handle.read()


def test_instance_page_summary_and_created_dropped():
    snap = prom.snapshot(page("vllm_a_before.txt"))
    s = snap["summary"]
    assert s["prefix_cache_queries"] == 2064
    assert s["prefix_cache_hits"] == 0
    assert s["external_prefix_cache_queries"] == 2064
    assert s["prompt_tokens_by_source"] == {"local_compute": 2064, "local_cache_hit": 0, "external_kv_transfer": 0}
    assert s["prompt_tokens_cached_by_source"]["device"] == 0
    assert s["lmcache_requested_tokens"] == 2064
    assert s["lmcache_stored_tokens"] == 2048
    assert s["lmcache_remote_write_bytes"] == 8 * 262144
    assert s["kv_cache_usage_perc"] == 0.0
    assert snap["summary_sources"]["prefix_cache_hits"] == "vllm:prefix_cache_hits"
    # the page has vllm:prefix_cache_queries_created gauges; they are not metrics of ours
    assert not [n for n in list(snap["counters"]) + list(snap["gauges"]) if n.endswith("_created")]
    # histograms are skipped, info metrics kept with their labels
    assert "vllm:time_to_first_token_seconds" not in snap["gauges"]
    assert snap["info"]["vllm:cache_config_info"][0]["enable_prefix_caching"] == "True"
    assert snap["info"]["vllm:cache_config_info"][0]["block_size"] == "16"


def test_delta_between_two_pages_of_the_same_instance():
    before = prom.snapshot(page("vllm_a_before.txt"))
    after = prom.snapshot(page("vllm_a_after.txt"))
    d = prom.delta(after, before)
    assert d["baseline_missing"] is False
    assert d["resets"] == []
    assert d["summary"]["prefix_cache_queries"] == 4096
    assert d["summary"]["prefix_cache_hits"] == 4096
    assert d["summary"]["prompt_tokens_by_source"] == {"local_compute": 0, "local_cache_hit": 4096, "external_kv_transfer": 0}
    assert d["summary"]["lmcache_requested_tokens"] == 4096
    assert d["summary"]["lmcache_stored_tokens"] == 0
    # gauges are reported as current values, not diffed
    assert d["summary"]["kv_cache_usage_perc"] == 0.12
    assert d["counters"]["vllm:generation_tokens"] == 16


def test_multiprocess_page_sums_engines_and_workers():
    snap = prom.snapshot(page("vllm_b_multiproc.txt"))
    s = snap["summary"]
    assert s["prefix_cache_queries"] == 2064 + 100
    assert s["external_prefix_cache_hits"] == 2048
    assert s["prompt_tokens_by_source"]["external_kv_transfer"] == 2048
    assert s["prompt_tokens_cached_by_source"]["external_unspecified"] == 2048
    assert s["kv_cache_usage_perc"] == 0.3  # max over engines
    assert s["lmcache_hit_tokens"] == 4096  # two TP workers
    assert s["lmcache_remote_read_bytes"] == 2 * 8 * 262144
    assert s["lmcache_retrieve_hit_rate"] == 0.992


def test_label_filter_selects_one_engine():
    snap = prom.snapshot(page("vllm_b_multiproc.txt"), label_filter={"engine": "1"})
    assert snap["summary"]["prefix_cache_queries"] == 100
    # lmcache series carry no engine label: they are kept
    assert snap["summary"]["lmcache_hit_tokens"] == 4096


def test_lmcache_mp_server_otel_names():
    snap = prom.snapshot(page("lmcache_mp_server.txt"))
    s = snap["summary"]
    assert s["lmcache_mp_lookup_requested_tokens"] == 4096
    assert s["lmcache_mp_lookup_hit_tokens"] == 2048
    assert s["lmcache_mp_lookup_hit_l2_tokens"] == 2048
    assert s["lmcache_mp_l2_store_completed_objects"] == 8
    assert s["lmcache_mp_l2_load_completed_objects"] == 8
    assert snap["summary_sources"]["lmcache_mp_lookup_hit_tokens"] == "lmcache_mp_lookup_hit_tokens"
    assert "target_info" not in snap["gauges"]  # not one of the prefixes


def test_mp_names_without_unit_suffix_also_match():
    text = "# TYPE lmcache_mp_lookup_hit_total counter\nlmcache_mp_lookup_hit_total 12\n"
    assert prom.snapshot(text)["summary"]["lmcache_mp_lookup_hit_tokens"] == 12


def test_router_page_per_backend():
    snap = prom.snapshot(page("router_production_stack.txt"))
    s = snap["summary"]
    assert s["router_incoming_requests"] == 6
    assert s["router_input_tokens_by_backend"] == {"http://10.0.0.11:8000": 6192, "http://10.0.0.12:8000": 4128}
    assert s["router_healthy_backends"] == 2
    b = snap["backends"]
    assert set(b) == {"http://10.0.0.11:8000", "http://10.0.0.12:8000"}
    assert b["http://10.0.0.11:8000"]["vllm:current_qps"] == 0.2
    # a gauge whose own name ends in _total stays a gauge
    assert "vllm:healthy_pods_total" in snap["gauges"]
    assert "vllm:healthy_pods" not in snap["counters"]


def test_untyped_total_is_a_counter():
    snap = prom.snapshot('vllm:prefix_cache_hits_total{engine="0"} 5\n')
    assert snap["counters"]["vllm:prefix_cache_hits"] == 5
    assert snap["summary"]["prefix_cache_hits"] == 5


def test_counter_reset_is_flagged():
    base = prom.snapshot('vllm:prefix_cache_hits_total 500\nvllm:prompt_tokens_by_source_total{source="local_compute"} 9\n')
    cur = prom.snapshot('vllm:prefix_cache_hits_total 20\nvllm:prompt_tokens_by_source_total{source="local_compute"} 12\n')
    d = prom.delta(cur, base)
    assert d["summary"]["prefix_cache_hits"] == 20
    assert d["summary"]["prompt_tokens_by_source"] == {"local_compute": 3}
    assert "prefix_cache_hits" in d["resets"]
    assert "vllm:prefix_cache_hits" in d["resets"]


def test_delta_without_baseline():
    assert prom.delta(prom.snapshot("vllm:a_total 1\n"), None)["baseline_missing"] is True


def test_add_totals_over_instances():
    a = prom.delta(prom.snapshot(page("vllm_a_after.txt")), prom.snapshot(page("vllm_a_before.txt")))
    b = prom.delta(prom.snapshot(page("vllm_b_multiproc.txt")), prom.snapshot(""))
    totals = prom.add_totals([a, b])
    assert totals["prefix_cache_hits"] == 4096
    assert totals["prompt_tokens_by_source"]["external_kv_transfer"] == 2048
    assert "kv_cache_usage_perc" not in totals


def test_garbage_is_a_parse_error():
    with pytest.raises(prom.MetricsParseError):
        prom.snapshot("<html><body>502 Bad Gateway</body></html>\n")


def test_nan_and_other_prefixes_are_skipped():
    snap = prom.snapshot("vllm:x NaN\nprocess_cpu_seconds_total 3\n")
    assert snap["series_count"] == 0


def test_extra_metrics_returns_series():
    snap = prom.snapshot(page("vllm_b_multiproc.txt"), extra_metrics=["vllm:prefix_cache_queries_total"])
    values = sorted(s["value"] for s in snap["selected"]["vllm:prefix_cache_queries_total"])
    assert values == [100, 2064]

from __future__ import annotations

import os

from ansible_collections.kvcache.offload.plugins.modules import metrics_snapshot

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "metrics")


def page(name):
    with open(os.path.join(FIX, name), "rb") as handle:
        return (200, handle.read())


def test_snapshot_then_delta(run_module, static_pages):
    static_pages.pages["/a/metrics"] = page("vllm_a_before.txt")
    static_pages.pages["/b/metrics"] = page("lmcache_mp_server.txt")
    a = static_pages.base_url + "/a/metrics"
    b = static_pages.base_url + "/b/metrics"
    before, failed = run_module(metrics_snapshot, {"urls": [a, b]})
    assert not failed, before.get("msg")
    assert "delta" not in before
    assert before["snapshots"][a]["ok"] is True
    assert before["snapshots"][a]["summary"]["prefix_cache_queries"] == 2064
    assert before["snapshots"][b]["summary"]["lmcache_mp_lookup_hit_tokens"] == 2048

    static_pages.pages["/a/metrics"] = page("vllm_a_after.txt")
    after, failed = run_module(metrics_snapshot, {"urls": [a, b], "baseline": before})
    assert not failed
    da = after["delta"]["per_url"][a]
    assert da["summary"]["prefix_cache_hits"] == 4096
    assert da["summary"]["prompt_tokens_by_source"]["local_cache_hit"] == 4096
    assert da["interval"] >= 0
    assert after["delta"]["per_url"][b]["summary"]["lmcache_mp_lookup_hit_tokens"] == 0
    assert after["delta"]["totals"]["prefix_cache_hits"] == 4096
    assert [r["path"] for r in static_pages.requests] == ["/a/metrics", "/b/metrics"] * 2


def test_baseline_may_be_the_snapshots_dict(run_module, static_pages):
    static_pages.pages["/m"] = page("vllm_a_before.txt")
    url = static_pages.base_url + "/m"
    before = run_module(metrics_snapshot, {"urls": [url]})[0]
    static_pages.pages["/m"] = page("vllm_a_after.txt")
    after = run_module(metrics_snapshot, {"urls": [url], "baseline": before["snapshots"]})[0]
    assert after["delta"]["per_url"][url]["summary"]["prefix_cache_hits"] == 4096


def test_url_missing_from_baseline(run_module, static_pages):
    static_pages.pages["/m"] = page("router_production_stack.txt")
    url = static_pages.base_url + "/m"
    result, failed = run_module(metrics_snapshot, {"urls": [url], "baseline": {}})
    assert not failed
    assert result["delta"]["per_url"][url]["baseline_missing"] is True
    assert result["snapshots"][url]["summary"]["router_input_tokens_by_backend"]["http://10.0.0.12:8000"] == 4128


def test_unreachable_and_404_fail(run_module, static_pages, closed_port):
    bad = "http://127.0.0.1:%d/metrics" % closed_port
    missing = static_pages.base_url + "/nothing"
    result, failed = run_module(metrics_snapshot, {"urls": [bad, missing], "timeout": 2})
    assert failed
    assert result["snapshots"][bad]["error"]["kind"] == "connection"
    assert result["snapshots"][missing]["error"] == {"kind": "http", "message": "HTTP 404"}
    assert bad in result["msg"] and missing in result["msg"]


def test_fail_on_error_false_reports(run_module, static_pages):
    static_pages.pages["/html"] = (200, b"<html>\n<body>oops</body>\n</html>\n")
    url = static_pages.base_url + "/html"
    result, failed = run_module(metrics_snapshot, {"urls": [url], "fail_on_error": False})
    assert not failed
    assert result["snapshots"][url]["ok"] is False
    assert result["snapshots"][url]["error"]["kind"] == "parse"


def test_timeout(run_module, static_pages):
    static_pages.delay = 2
    static_pages.pages["/m"] = page("vllm_a_before.txt")
    result, failed = run_module(metrics_snapshot, {"urls": [static_pages.base_url + "/m"], "timeout": 0.3})
    assert failed
    assert result["snapshots"][static_pages.base_url + "/m"]["error"]["kind"] == "timeout"


def test_label_filter_and_check_mode(run_module, static_pages):
    static_pages.pages["/m"] = page("vllm_b_multiproc.txt")
    url = static_pages.base_url + "/m"
    result, failed = run_module(metrics_snapshot, {"urls": [url], "label_filter": {"engine": 1}}, check_mode=True)
    assert not failed
    assert result["snapshots"][url]["summary"]["prefix_cache_queries"] == 100


def test_key_and_extra_headers_are_sent(run_module, static_pages):
    # headers is part of the collection's HTTP contract (module_defaults group kvcache.offload.http).
    static_pages.pages["/m"] = page("vllm_a_before.txt")
    result, failed = run_module(metrics_snapshot, {"urls": [static_pages.base_url + "/m"], "api_key": "metrics-key",
                                                   "headers": {"X-Scope-OrgID": "kvcache"}})
    assert not failed, result.get("msg")
    sent = static_pages.requests[0]["headers"]
    assert sent["authorization"] == "Bearer metrics-key" and sent["x-scope-orgid"] == "kvcache"
    assert "metrics-key" not in str(result)

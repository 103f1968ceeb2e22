"""The stage judges and the report they make up (module_utils/validation_stages)."""
from __future__ import annotations

import copy
import json
import os
import re

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import prom
from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import SCHEMA_VERSION, hit_numbers

from validation_helpers import A, B, HERE, build, fixture, good_inputs, metrics, node, probe, stage, tier

DOCS = os.path.join(HERE, "..", "..", "..", "..", "docs", "validation-report.md")


def test_hit_numbers_on_a_real_vllm_cpu_page():
    snap = prom.snapshot(fixture("vllm_cpu_lab_node2.txt"))
    after_text = fixture("vllm_cpu_lab_node2.txt").replace(
        'source="external_kv_transfer"} 0.0', 'source="external_kv_transfer"} 2288.0')
    d = prom.delta(prom.snapshot(after_text), snap)
    hits = hit_numbers(d["summary"])
    assert hits["external_kv_tokens"] == 2288
    assert hits["has_external_metrics"]


def test_everything_passes_and_the_router_is_skipped():
    report = build(good_inputs())
    assert report["result"] == "pass", json.dumps(report["stages"], indent=1)
    assert [s["status"] for s in report["stages"]] == ["pass", "pass", "pass", "pass", "skipped", "pass", "skipped", "skipped"]
    assert stage(report, "router")["reason"] == "group kvcache_router has no hosts"
    assert stage(report, "gds_path")["reason"].startswith("GDS is off")
    assert stage(report, "tier_write")["numbers"]["objects_added"] == 4
    assert stage(report, "tier_write")["numbers"]["bytes_added"] == 4000
    assert stage(report, "local_hit")["numbers"]["local_cache_hit_tokens"] == 4352
    assert stage(report, "cross_instance")["numbers"]["external_kv_tokens"] == 2288
    assert stage(report, "cross_instance")["numbers"]["ttft_speedup"] == 2.25
    assert stage(report, "lmcache_probe")["numbers"]["loads_matching"] == 1
    assert report["failed_required"] == []
    assert report["causes"] == []
    # only whitelisted settings are copied from the nodes' files
    assert "KVCACHE_LMCACHE_CONFIG_FINGERPRINT" not in json.dumps(report)


def test_tier_unwritable_for_the_service_user_fails_stage_2():
    inputs = good_inputs()
    for n in inputs["nodes"]:
        n["write_test"] = {"rc": 1, "stderr": "sh: 1: cannot create /mnt/kvcache/.x: Permission denied"}
    inputs["stages"]["tier_write"]["after"] = tier(10, 1000)
    inputs["stages"]["lmcache_probe"]["store"]["result"] = {
        "ok": False, "stage": "storage", "error": "PermissionError: [Errno 13] Permission denied: '/mnt/kvcache/x.tmp'"}
    inputs["stages"]["lmcache_probe"]["load_results"] = [{"skipped": True}]
    report = build(inputs)
    s2 = stage(report, "tier_write")
    assert s2["status"] == "fail"
    assert s2["numbers"]["objects_added"] == 0
    assert "tier_not_writable" in s2["causes"]
    assert "did not grow" in s2["reason"]
    assert stage(report, "lmcache_probe")["status"] == "fail"
    assert "tier_not_writable" in stage(report, "lmcache_probe")["causes"]
    assert set(report["failed_required"]) >= {"tier_write", "lmcache_probe"}


def test_instances_down_401_and_open():
    inputs = good_inputs()
    st = inputs["stages"]["instances"]
    st["health"][0] = {"status": -1, "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"}
    st["authed"][0] = probe([None], status=None, error={"kind": "connection", "message": "Connection refused"})
    st["authed"][1] = probe([None], status=401, error={"kind": "http", "message": "HTTP 401", "body": "Unauthorized"})
    st["unauthed"][1] = {"status": 200, "rounds": [], "error": {"kind": "http", "message": "HTTP 200"}}
    inputs["stages"]["tier_write"] = {"skipped": True, "reason": "no instance answered in stage 1"}
    report = build(inputs)
    s1 = stage(report, "instances")
    assert s1["status"] == "fail"
    assert s1["numbers"] == {"instances": 2, "healthy": 1, "answered_with_key": 0, "refused_without_key": 1}
    assert {"instance_unreachable", "api_key_rejected", "auth_not_enforced"} <= set(s1["causes"])
    assert stage(report, "tier_write")["status"] == "skipped"


def test_router_stage_counts_hits_over_backends():
    inputs = good_inputs()
    inputs["stages"]["router"] = {"url": "http://172.29.100.20:8001", "health": {"status": 200}, "probe": probe([0.1, 0.1]),
                                  "metrics": metrics({A["url"]: {"prompt_tokens": 2300.0, "prefix_cache_hits": 2288.0},
                                                      B["url"]: {"prompt_tokens": 2300.0, "prefix_cache_hits": 2288.0}})}
    report = build(inputs)
    s5 = stage(report, "router")
    assert s5["status"] == "pass"
    assert s5["numbers"]["cache_hit_tokens"] == 4576 and s5["numbers"]["backends_served"] == 2


def test_optional_stage_failure_does_not_fail_the_run():
    inputs = good_inputs()
    inputs["settings"]["required_stages"] = ["instances", "tier_write", "local_hit", "lmcache_probe"]
    inputs["stages"]["cross_instance"]["hit"] = probe([None], status=None, error={"kind": "timeout", "message": "timed out"})
    report = build(inputs)
    assert report["result"] == "pass"
    assert report["failed_optional"] == ["cross_instance"]
    assert "instance_timeout" in stage(report, "cross_instance")["causes"]


def test_required_ttft_drop():
    inputs = good_inputs()
    inputs["settings"]["require_ttft_drop"] = True
    inputs["stages"]["cross_instance"]["hit"] = probe([0.5])
    report = build(inputs)
    assert stage(report, "cross_instance")["status"] == "fail"
    assert "ttft_not_lower" in stage(report, "cross_instance")["causes"]


def test_lmcache_probe_sha_mismatch_and_connect_failure():
    inputs = good_inputs()
    inputs["stages"]["lmcache_probe"]["load_results"][0]["sha256"] = "ee" * 32
    report = build(inputs)
    assert stage(report, "lmcache_probe")["status"] == "fail"
    assert "sha256 differs" in stage(report, "lmcache_probe")["reason"]
    inputs = good_inputs()
    inputs["stages"]["lmcache_probe"]["store"]["result"] = {"ok": False, "stage": "connect", "error": "no remote backend connected"}
    report = build(inputs)
    assert stage(report, "lmcache_probe")["causes"] == ["lmcache_remote_not_configured"]


def _schema():
    with open(DOCS, encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(r"<!-- schema -->\s*```json\n(.*?)\n```", text, re.S)
    assert match, "docs/validation-report.md must hold the schema in a ```json block after <!-- schema -->"
    return json.loads(match.group(1))


@pytest.mark.parametrize("mutate", [
    None,
    lambda i: i["nodes"][1].update(node("lab-node2", fixture("lab-node2-cpu0.env").replace("=123", "=9"))),
    lambda i: i["stages"].update(instances={"instances": [], "health": [], "authed": [], "unauthed": []}),
    lambda i: i.update(stages={}),
])
def test_reports_match_the_documented_schema(mutate):
    jsonschema = pytest.importorskip("jsonschema")
    inputs = copy.deepcopy(good_inputs())
    if mutate:
        mutate(inputs)
    report = build(inputs)
    jsonschema.validate(json.loads(json.dumps(report)), _schema())
    assert report["schema_version"] == SCHEMA_VERSION


def test_unwritable_tier_fails_stage_2_even_when_objects_appeared():
    inputs = good_inputs()
    inputs["nodes"][1]["write_test"] = {"rc": 1, "stderr": "Permission denied"}
    report = build(inputs)
    s2 = stage(report, "tier_write")
    assert s2["status"] == "fail" and "tier_not_writable" in s2["causes"]
    assert "measured: 4 objects added" in s2["reason"]


# Multiprocess mode: stage 4 also reads the counters of B's node's LMCache server (its /metrics
# on loopback, read on that node), so the report shows LMCache loaded the chunks from its L2.
LMCACHE_B = "http://127.0.0.1:8080"


def _mp_inputs(l2_tokens, l1_tokens=0.0):
    inputs = good_inputs()
    inputs["expected"]["lmcache_mode"] = "multiprocess"
    inputs["stages"]["cross_instance"]["lmcache_url"] = LMCACHE_B
    inputs["stages"]["cross_instance"]["lmcache_metrics"] = metrics(
        {LMCACHE_B: {"lmcache_mp_lookup_hit_tokens": l2_tokens + l1_tokens, "lmcache_mp_lookup_hit_l1_tokens": l1_tokens,
                     "lmcache_mp_lookup_hit_l2_tokens": l2_tokens, "lmcache_mp_lookup_requested_tokens": 2300.0}})
    return inputs


def test_multiprocess_cross_node_load_shows_in_lmcache_l2_counters():
    report = build(_mp_inputs(2304.0))
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "pass", s4
    assert s4["numbers"]["lmcache_l2_hit_tokens"] == 2304
    assert s4["numbers"]["lmcache_l1_hit_tokens"] == 0
    assert "2304 from its L2" in s4["reason"]


def test_multiprocess_cross_node_without_lmcache_l2_hits_fails_stage_4():
    # vLLM counted external tokens, LMCache's server on B's node found nothing in its L2:
    # the tokens did not come from the shared tier.
    report = build(_mp_inputs(0.0, l1_tokens=2304.0))
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail", s4
    assert "L2" in s4["reason"] and "lab-node2" in s4["reason"]


def test_multiprocess_lmcache_counters_unreadable_fail_stage_4_with_the_cause():
    inputs = _mp_inputs(2304.0)
    inputs["stages"]["cross_instance"]["lmcache_metrics"] = {
        "urls": [LMCACHE_B + "/metrics"],
        "snapshots": {LMCACHE_B + "/metrics": {"ok": False, "error": {"kind": "connection", "message": "refused"}}}}
    report = build(inputs)
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail"
    assert "metrics_unavailable" in s4["causes"]
    assert "LMCache server" in s4["reason"]


LMCACHE_A = "http://127.0.0.1:8080"


def _mp_tier_inputs(stored_chunks):
    inputs = good_inputs()
    inputs["expected"]["lmcache_mode"] = "multiprocess"
    inputs["stages"]["tier_write"]["lmcache_url"] = LMCACHE_A
    inputs["stages"]["tier_write"]["lmcache_metrics"] = metrics(
        {LMCACHE_A: {"lmcache_mp_l2_store_completed_objects": stored_chunks}})
    return inputs


def test_multiprocess_tier_write_shows_lmcache_l2_stores():
    s2 = stage(build(_mp_tier_inputs(6.0)), "tier_write")
    assert s2["status"] == "pass", s2
    assert s2["numbers"]["lmcache_l2_stored_chunks"] == 6
    assert "LMCache's server on lab-node1 stored 6 chunks in its L2" in s2["reason"]


def test_multiprocess_tier_grew_without_lmcache_stores_fails_stage_2():
    # the listing grew (someone else wrote), LMCache's server on A stored nothing
    s2 = stage(build(_mp_tier_inputs(0.0)), "tier_write")
    assert s2["status"] == "fail", s2
    assert "stored 0 chunks in its L2" in s2["reason"] and "lab-node1" in s2["reason"]


def _mp_local_inputs(l1_tokens, l2_tokens):
    """Stages 2 and 3 share one raw in the role (report.yml: local_hit: *validation_stage_a)."""
    inputs = _mp_tier_inputs(6.0)
    inputs["stages"]["tier_write"]["lmcache_metrics"] = metrics({LMCACHE_A: {
        "lmcache_mp_l2_store_completed_objects": 6.0, "lmcache_mp_lookup_hit_tokens": l1_tokens + l2_tokens,
        "lmcache_mp_lookup_hit_l1_tokens": l1_tokens, "lmcache_mp_lookup_hit_l2_tokens": l2_tokens}})
    inputs["stages"]["local_hit"].update({key: inputs["stages"]["tier_write"][key]
                                          for key in ("lmcache_url", "lmcache_metrics")})
    return inputs


def test_multiprocess_local_hit_shows_the_lmcache_server_l1_lookups():
    s3 = stage(build(_mp_local_inputs(3072.0, 0.0)), "local_hit")
    assert s3["status"] == "pass", s3
    assert (s3["numbers"]["lmcache_l1_hit_tokens"], s3["numbers"]["lmcache_l2_hit_tokens"]) == (3072, 0)
    assert "LMCache's server on lab-node1: 3072 from its L1 (CPU RAM), 0 from its L2" in s3["reason"]


def test_multiprocess_local_hit_without_lmcache_lookup_hits_fails_stage_3():
    # vLLM's own prefix cache hit, but A's LMCache server holds nothing of the prefix it stored
    s3 = stage(build(_mp_local_inputs(0.0, 0.0)), "local_hit")
    assert s3["status"] == "fail", s3
    assert "found none of the repeated prefix" in s3["reason"] and "lab-node1" in s3["reason"]


def _mp_router_inputs(by_node):
    inputs = good_inputs()
    inputs["expected"]["lmcache_mode"] = "multiprocess"
    inputs["stages"]["router"] = {
        "a": A, "url": "http://172.29.100.20:8001", "router_hosts": ["lab-router"], "health": {"status": 200},
        "probe": probe([0.10, 0.09]),
        "metrics": metrics({A["url"]: {"prompt_tokens_by_source": {"local_compute": 2.0, "local_cache_hit": 3072.0,
                                                                   "external_kv_transfer": 0.0}}}),
        "lmcache_metrics_by_node": by_node}
    return inputs


def _server(l1_tokens, l2_tokens):
    return metrics({LMCACHE_A: {"lmcache_mp_lookup_hit_l1_tokens": l1_tokens,
                                "lmcache_mp_lookup_hit_l2_tokens": l2_tokens}})


def test_multiprocess_router_rounds_show_in_the_serving_nodes_lmcache_lookups():
    s5 = stage(build(_mp_router_inputs({"lab-node1": _server(3072.0, 0.0), "lab-node2": _server(0.0, 0.0)})), "router")
    assert s5["status"] == "pass", s5
    assert (s5["numbers"]["lmcache_l1_hit_tokens"], s5["numbers"]["lmcache_l2_hit_tokens"]) == (3072, 0)
    assert "LMCache's servers found 3072 tokens in L1, 0 in L2 (lab-node1 3072)" in s5["reason"]


def test_multiprocess_router_rounds_without_lmcache_lookup_hits_fail_stage_5():
    s5 = stage(build(_mp_router_inputs({"lab-node1": _server(0.0, 0.0), "lab-node2": _server(0.0, 0.0)})), "router")
    assert s5["status"] == "fail", s5
    assert "the LMCache servers on lab-node1, lab-node2 found none of the prefix" in s5["reason"]


def test_multiprocess_router_unreadable_lmcache_counters_name_the_node():
    unreadable = {"urls": [LMCACHE_A + "/metrics"],
                  "snapshots": {LMCACHE_A + "/metrics": {"ok": False,
                                                         "error": {"kind": "connection", "message": "refused"}}}}
    report = build(_mp_router_inputs({"lab-node1": _server(3072.0, 0.0), "lab-node2": unreadable}))
    s5 = stage(report, "router")
    assert s5["status"] == "fail" and "the LMCache server's counters on lab-node2" in s5["reason"], s5
    assert "metrics_unavailable" in s5["causes"]

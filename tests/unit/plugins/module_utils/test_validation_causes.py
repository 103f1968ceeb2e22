"""The cause catalogue and the detection of causes (module_utils/validation_causes), in whole reports too."""
from __future__ import annotations

import json

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils.validation_causes import Causes, causes_from_text, volume_full

from validation_helpers import build, env_slurp, fixture, good_inputs, node, probe, stage, tier


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
    # the seed is a fleet secret: the report says who differs, never a value (issue #33)
    assert "lab-node2/cpu0=another seed #1" in cause["message"], cause
    assert "lab-node1/cpu0=the fleet's seed" in cause["message"], cause
    text = json.dumps(report)
    assert "999" not in text and "123" not in text
    assert report["fleet"]["expected"]["hash_seed"] == "the fleet's seed"
    assert "2288 external KV tokens" in s4["reason"]
    assert report["result"] == "fail" and report["failed_required"] == ["cross_instance"]
    # the other stages are not blamed on it
    assert stage(report, "tier_write")["status"] == "pass"


def test_two_odd_seeds_get_two_labels_and_equal_seeds_one():
    inputs = good_inputs()
    inputs["nodes"][0] = node("lab-node1", fixture("lab-node2-cpu0.env").replace("PYTHONHASHSEED=123", "PYTHONHASHSEED=7"))
    inputs["nodes"][1] = node("lab-node2", fixture("lab-node2-cpu0.env").replace("PYTHONHASHSEED=123", "PYTHONHASHSEED=8"))
    report = build(inputs)
    seeds = sorted(c["hash_seed"] for c in report["fleet"]["instances"])
    assert seeds == ["another seed #1", "another seed #2"], seeds
    cause = [c for c in report["causes"] if c["id"] == "hash_seed_mismatch"][0]
    assert sorted(cause["hosts"]) == ["lab-node1", "lab-node2"]


def test_unset_seed_model_and_tp_mismatch():
    inputs = good_inputs()
    other = fixture("lab-node2-cpu0.env").replace("PYTHONHASHSEED=123\n", "").replace(
        "--model /opt/kvcache/models/tiny-qwen2", "--model other/model").replace("--tensor-parallel-size 1", "--tensor-parallel-size 2")
    inputs["nodes"][1] = node("lab-node2", other)
    report = build(inputs)
    assert {"hash_seed_unset", "model_mismatch", "tp_mismatch"} <= set(stage(report, "cross_instance")["causes"])


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
    assert volume_full(total, free) is full


def test_enospc_and_quota_texts_are_tier_full():
    for text in ("OSError: [Errno 28] No space left on device: '/mnt/kvcache/a'",
                 "OSError: [Errno 122] Disk quota exceeded"):
        causes = Causes()
        assert causes_from_text(causes, text, host="lab-node2") == ["tier_full"]
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


def test_unreachable_node():
    inputs = good_inputs()
    inputs["nodes"][1] = {"host": "lab-node2", "unreachable": True, "msg": "container not running", "env_slurps": [],
                          "lmcache_slurp": {"unreachable": True}, "findmnt": {"unreachable": True}, "write_test": {"unreachable": True}}
    inputs["stages"]["lmcache_probe"]["load_results"] = [{"__validation_load_node": "lab-node2", "unreachable": True,
                                                          "msg": "container not running"}]
    report = build(inputs)
    assert "node_unreachable" in stage(report, "lmcache_probe")["causes"]


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
    assert "journalctl" in [c for c in report["causes"] if c["id"] == "engine_failed"][0]["fix"]


def test_an_open_s3_breaker_in_a_server_is_named_with_the_node_and_the_adapter():
    """Issue #40 item 3: the server's GET /status (storage_manager.l2_adapters) says the S3 adapter gave up; the report
    names that cause (node, adapter, endpoint) on the stages it breaks, not only ttft_not_lower."""
    inputs = good_inputs()
    inputs["stages"]["tier_write"]["after"] = inputs["stages"]["tier_write"]["before"]  # nothing reached the tier
    inputs["nodes"][0]["lmcache_l2"] = [{"type": "S3L2Adapter", "endpoint": "kvcache.s3.lab:8333", "is_healthy": False,
                                         "connection_failures": 3, "connection_disabled": True}]
    inputs["nodes"][1]["lmcache_l2"] = [{"type": "S3L2Adapter", "connection_disabled": False, "connection_failures": 0}]
    report = build(inputs)
    cause = [c for c in report["causes"] if c["id"] == "lmcache_l2_disabled"]
    assert len(cause) == 1, report["causes"]
    assert "lab-node1: adapter 0 (S3L2Adapter, kvcache.s3.lab:8333)" in cause[0]["message"], cause
    assert "never tries again" in cause[0]["message"] and "restart-pending" in cause[0]["fix"], cause
    assert stage(report, "tier_write")["status"] == "fail"
    assert "lmcache_l2_disabled" in stage(report, "tier_write")["causes"]
    # the half-open adapter says when it tries again; a server not read (None) is no finding
    inputs["nodes"][0]["lmcache_l2"][0]["retry_after_seconds"] = 30.0
    inputs["nodes"][1]["lmcache_l2"] = None
    again = [c for c in build(inputs)["causes"] if c["id"] == "lmcache_l2_disabled"]
    assert len(again) == 1 and "tries S3 again 30.0 s after it opened" in again[0]["message"], again

"""Parsing what the validation read on the nodes (module_utils/validation_settings)."""
from __future__ import annotations

import json

from ansible_collections.kvcache.offload.plugins.module_utils.validation_settings import fs_mount_state, instance_config, lmcache_settings

from validation_helpers import fixture


def test_instance_config_from_the_lab_env_file():
    cfg = instance_config("lab-node2", "cpu0", fixture("lab-node2-cpu0.env"))
    assert cfg["hash_seed"] == "123"
    assert cfg["model"] == "/opt/kvcache/models/tiny-qwen2"
    assert cfg["served_model_name"] == "tiny-qwen2"
    assert cfg["tensor_parallel_size"] == "1"
    assert cfg["kv_cache_dtype"] == "auto"
    assert cfg["kv_connector"] == "ExampleConnector"
    assert cfg["telemetry_missing"] == []


def test_instance_config_reports_missing_telemetry_and_seed():
    cfg = instance_config("h", "i", "VLLM_ARGS='--model m --tensor-parallel-size=2'\nDO_NOT_TRACK=1\nLMCACHE_TRACK_USAGE=true\n")
    assert cfg["hash_seed"] is None
    assert cfg["tensor_parallel_size"] == "2"
    assert cfg["kv_connector"] is None
    assert cfg["telemetry_missing"] == ["LMCACHE_TRACK_USAGE=false", "VLLM_NO_USAGE_STATS=1", "PROMETHEUS_MULTIPROC_DIR"]


def test_lmcache_settings_of_the_lab_config():
    s = lmcache_settings(fixture("lab-lmcache-config.yaml"))
    assert s["readable"] and s["chunk_size"] == 256
    assert s["remote_storage_plugins"] == ["fs"] and s["fs_base_path"] == "/mnt/kvcache"
    assert lmcache_settings(None)["error"] == "missing"
    assert "YAML" in lmcache_settings("a: [").get("error")


def test_fs_mount_state_from_findmnt():
    state = fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": fixture("lab-findmnt.json")}, {"rc": 0})
    assert state["is_mount"] and state["read_only"] is False and state["writable_by_service_user"]
    ro = fixture("lab-findmnt.json").replace('"rw,', '"ro,')
    assert fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": ro}, {"rc": 1, "stderr": "Read-only file system"})["read_only"]
    below = json.dumps({"filesystems": [{"target": "/", "source": "overlay", "fstype": "overlay", "options": "rw"}]})
    assert fs_mount_state("/mnt/kvcache", {"rc": 0, "stdout": below}, None)["is_mount"] is False
    assert fs_mount_state("/mnt/kvcache", {"rc": 1, "stdout": ""}, None)["exists"] is False
    assert fs_mount_state("/mnt/kvcache", {"skipped": True}, {"skipped": True})["checked"] is False


def test_the_multiprocess_servers_env_file_gives_the_same_keys():
    from ansible_collections.kvcache.offload.plugins.module_utils.validation_settings import lmcache_settings
    text = ("LMCACHE_SERVER_ARGS=--host 127.0.0.1 --port 5555 --chunk-size 512 --l1-size-gb 1.0 --eviction-policy LRU "
            "--supported-transfer-mode auto --http-host 127.0.0.1 --http-port 8080\n"
            "LMCACHE_L2_ADAPTER='{\"type\":\"fs\",\"base_path\":\"/mnt/kvcache\"}'\nPYTHONHASHSEED=123\n")
    got = lmcache_settings(text)
    assert got["readable"] and got["error"] is None
    assert (got["chunk_size"], got["remote_storage_plugins"], got["fs_base_path"], got["mode"]) == (
        512, ["fs"], "/mnt/kvcache", "multiprocess")
    s3 = lmcache_settings(text.replace('{\"type\":\"fs\",\"base_path\":\"/mnt/kvcache\"}',
                                       '{\"type\":\"s3\",\"s3_endpoint\":\"b.s3.lab:8333\"}'))
    assert s3["remote_url"] == "s3://b.s3.lab:8333" and s3["remote_storage_plugins"] == ["s3"]
    # the lmcache role's half-open S3 adapter (lmcache_s3_retry_after_seconds) through LMCache's plugin adapter
    plugin = lmcache_settings(text.replace(
        '{\"type\":\"fs\",\"base_path\":\"/mnt/kvcache\"}',
        '{\"type\":\"plugin\",\"module_path\":\"kvcache_s3_l2\",\"class_name\":\"RecoveringS3L2Adapter\",'
        '\"adapter_params\":{\"s3_endpoint\":\"b.s3.lab:8333\",\"retry_after_seconds\":30}}'))
    assert plugin["remote_url"] == "s3://b.s3.lab:8333" and plugin["remote_storage_plugins"] == ["s3"], plugin
    assert lmcache_settings(text.replace("--chunk-size 512", "--chunk-size big"))["readable"] is False

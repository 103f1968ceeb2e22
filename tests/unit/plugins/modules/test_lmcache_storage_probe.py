"""lmcache_storage_probe runs its program with a real interpreter against a test double of
LMCache's API (tests/unit/fixtures/fake_lmcache), whose remote tier is a temp directory."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import lmcache_probe
from ansible_collections.kvcache.offload.plugins.modules import lmcache_storage_probe

FAKE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "fake_lmcache")


@pytest.fixture
def node(tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    config = tmp_path / "lmcache-config.yaml"
    config.write_text("chunk_size: 256\nremote_url: fs://localhost:0/fake\n")

    def args(action, mode="", **kw):
        base = {"python": sys.executable, "config_file": str(config), "action": action, "probe_id": "run-1",
                "environment": {"PYTHONPATH": FAKE, "FAKE_LMCACHE_TIER": str(tier_dir), "FAKE_LMCACHE_MODE": mode,
                                "LMCACHE_TRACK_USAGE": "true"},
                "timeout": 20}
        base.update(kw)
        return base

    def calls():
        path = tier_dir / "calls.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    return args, calls, tier_dir, config


def test_store_then_load_bit_exact(run_module, node):
    args, calls, tier_dir, config = node
    stored, failed = run_module(lmcache_storage_probe, args("store"))
    assert not failed, stored
    assert stored["changed"] is True and stored["ok"] is True
    assert stored["exists"] is True
    assert stored["connector"] == "FSConnector"
    assert stored["lmcache_version"] is None  # the double has no __version__ (empty __init__.py); the real 0.5.6 has
    assert stored["key"].startswith("kvcache-offload-probe@8@0@")
    assert stored["bytes"] == 2 * 2 * 4 * 8 * 16
    assert len(os.listdir(str(tier_dir))) == 2  # the chunk and the call log

    loaded, failed = run_module(lmcache_storage_probe, args("load", expected_sha256=stored["sha256"].upper()))
    assert not failed, loaded
    assert loaded["changed"] is False
    assert loaded["match"] is True
    assert loaded["sha256"] == stored["sha256"]
    seen = calls()
    # a chunk of whole 4 KiB pages: S3Connector refuses LMCache's 1 KiB test default
    assert [c.get("kv_shape") for c in seen if c["call"] == "storage_manager"][0] == [4, 2, 256, 2, 128]
    assert [c["call"] for c in seen] == ["config", "storage_manager", "allocate", "put", "contains", "close",
                                         "config", "storage_manager", "contains", "get", "close"]
    assert seen[0]["path"] == str(config)
    assert seen[0]["track_usage"] == "false"  # telemetry forced off over the caller's value
    assert seen[3]["key"] == stored["key"] == seen[9]["key"]


def test_other_probe_id_is_not_found(run_module, node):
    args = node[0]
    run_module(lmcache_storage_probe, args("store"))
    result, failed = run_module(lmcache_storage_probe, args("load", probe_id="run-2"))
    assert failed
    assert result["stage"] == "lookup"
    assert result["exists"] is False


def test_corrupted_read_fails_compare(run_module, node):
    args = node[0]
    stored = run_module(lmcache_storage_probe, args("store"))[0]
    result, failed = run_module(lmcache_storage_probe, args("load", mode="corrupt", expected_sha256=stored["sha256"]))
    assert failed
    assert result["match"] is False
    assert result["stage"] == "compare"


def test_lost_put_fails_store(run_module, node):
    result, failed = run_module(lmcache_storage_probe, node[0]("store", mode="put_lost"))
    assert failed
    assert result["stage"] == "store"
    assert result["changed"] is False


def test_no_remote_configured(run_module, node):
    result, failed = run_module(lmcache_storage_probe, node[0]("store", mode="no_remote"))
    assert failed
    assert result["stage"] == "connect"
    assert "remote" in result["msg"]


def test_storage_exception_is_reported(run_module, node):
    result, failed = run_module(lmcache_storage_probe, node[0]("store", mode="raise"))
    assert failed
    assert result["stage"] == "storage"
    assert "403 Forbidden" in result["error"]


def test_hang_is_killed_at_timeout(run_module, node):
    started = time.monotonic()
    result, failed = run_module(lmcache_storage_probe, node[0]("store", mode="hang", timeout=1.5))
    assert failed
    assert result["stage"] == "timeout"
    assert time.monotonic() - started < 15


def test_a_close_that_never_returns_does_not_hold_the_result(run_module, node):
    """LMCache 0.5.6's S3Connector.close() hangs: the probe reports after a bounded wait."""
    started = time.monotonic()
    result, failed = run_module(lmcache_storage_probe, node[0]("store", mode="close_hangs", timeout=60))
    assert not failed, result
    assert result["ok"] is True and result["exists"] is True
    assert [c["call"] for c in node[1]()][-1] == "close"
    assert time.monotonic() - started < 40  # close waited for 10 s at most, never the 60 s timeout


def test_lmcache_missing_in_venv(run_module, node):
    args = node[0]("store")
    args["environment"] = {"PYTHONPATH": ""}
    result, failed = run_module(lmcache_storage_probe, args)
    assert failed
    assert result["stage"] == "import"


def test_bad_interpreter_and_config(run_module, node, tmp_path):
    result, failed = run_module(lmcache_storage_probe, node[0]("store", python=str(tmp_path / "nope" / "python")))
    assert failed and result["stage"] == "program"
    result, failed = run_module(lmcache_storage_probe, node[0]("store", config_file=str(tmp_path / "missing.yaml")))
    assert failed and "does not exist" in result["msg"]


def test_check_mode_store_writes_nothing(run_module, node):
    args, calls = node[0], node[1]
    result, failed = run_module(lmcache_storage_probe, args("store"), check_mode=True)
    assert not failed
    assert result["changed"] is False
    assert calls() == []


def test_parse_output_takes_last_marker_line():
    out = "log line\n%s{\"ok\": false}\nnoise\n%s{\"ok\": true}\n%snot json\n" % ((lmcache_probe.MARK,) * 3)
    assert lmcache_probe.parse_output(out) == {"ok": True}
    assert lmcache_probe.parse_output("") is None


def test_env_files_reach_the_program_and_are_not_logged(run_module, node, tmp_path):
    args, _calls, tier_dir, _config = node
    env_file = tmp_path / "s3-credentials.env"
    env_file.write_text("# root-only in production\nFAKE_LMCACHE_TIER='%s'\nAWS_SECRET_ACCESS_KEY=s3cr3t-value\n" % tier_dir)
    a = args("store", env_files=[str(env_file)])
    del a["environment"]["FAKE_LMCACHE_TIER"]
    stored, failed = run_module(lmcache_storage_probe, a)
    assert not failed, stored
    assert stored["ok"] is True
    assert "s3cr3t-value" not in json.dumps(stored)


def test_missing_env_file_fails_before_running(run_module, node, tmp_path):
    args, calls, _tier_dir, _config = node
    result, failed = run_module(lmcache_storage_probe, args("store", env_files=[str(tmp_path / "nope.env")]))
    assert failed and result["stage"] == "program"
    assert "nope.env" in result["error"]
    assert calls() == []


def test_run_as_needs_root(run_module, node, monkeypatch):
    args, calls, _tier_dir, _config = node
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result, failed = run_module(lmcache_storage_probe, args("store", run_as="kvcache"))
    assert failed and "run_as needs root" in result["error"]
    assert calls() == []


def test_multiprocess_mode_reads_the_servers_l2_adapter_only(run_module, node, tmp_path):
    """mode=multiprocess takes LMCACHE_L2_ADAPTER from the server's env file (nothing else of it)
    and runs the L2 path: with the fake LMCache (no lmcache.v1.distributed) it stops at the import
    of LMCache's L2 adapter factory, named in the result."""
    args = node[0]("store", mode="multiprocess")
    del args["config_file"]
    server_env = tmp_path / "lmcache-server.env"
    server_env.write_text("LMCACHE_SERVER_ARGS=--chunk-size 256\nLMCACHE_L2_ADAPTER='{\"type\":\"fs\",\"base_path\":\"/x\"}'\n")
    args.update(mode="multiprocess", server_env_file=str(server_env))
    result, failed = run_module(lmcache_storage_probe, args)
    assert failed and result["stage"] == "import", result
    assert "lmcache.v1.distributed" in result["error"], result
    server_env.write_text("LMCACHE_SERVER_ARGS=--chunk-size 256\n")
    result, failed = run_module(lmcache_storage_probe, args)
    assert failed and result["stage"] == "connect" and "LMCACHE_L2_ADAPTER" in result["error"], result


def test_inprocess_mode_needs_the_config_file(run_module, node):
    args = node[0]("store")
    del args["config_file"]
    result, failed = run_module(lmcache_storage_probe, args)
    assert failed and "config_file" in result["msg"], result


def test_an_unreadable_cufile_json_is_reported_not_a_crash(run_module, node, tmp_path):
    """A cufile.json that is not JSON (hand-edited on the node) fails the GDS probe at its own stage,
    naming the file; the probe used to crash before its result (UnboundLocalError on `out`)."""
    broken = tmp_path / "cufile.json"
    broken.write_text('{"properties": {"allow_compat_mode": false,}')  # a trailing comma: cuFile refuses it too
    gds_stats = tmp_path / "gds_stats"
    gds_stats.write_text("#!/bin/sh\nexit 0\n")
    gds_stats.chmod(0o755)
    result, failed = run_module(lmcache_storage_probe, node[0]("store", cufile_json=str(broken), gds_stats=str(gds_stats)))
    assert failed
    assert result["stage"] == "cufile_json", result
    assert str(broken) in result["error"] and "JSON" in result["error"], result
    assert node[1]() == []  # LMCache was not started

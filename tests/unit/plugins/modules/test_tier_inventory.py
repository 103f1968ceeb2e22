from __future__ import annotations

import json
import os

from botocore.stub import Stubber

from ansible_collections.kvcache.offload.plugins.module_utils import tier
from ansible_collections.kvcache.offload.plugins.modules import tier_inventory

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "s3")


def _read(name):
    with open(os.path.join(FIX, name), "rb") as handle:
        return handle.read()


def _touch(path, size, mtime):
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)
    os.utime(path, (mtime, mtime))


def test_fs_inventory_and_delta(run_module, tmp_path):
    root = str(tmp_path)
    _touch(os.path.join(root, "-SEP-models-SEP-tiny@1@0@1a@bfloat16.data"), 64, 1_800_000_000)
    before, failed = run_module(tier_inventory, {"backend": "fs", "path": root, "models": ["/models/tiny"]})
    assert not failed, before.get("msg")
    assert before["objects"] == 1
    assert before["models"]["/models/tiny"]["bytes"] == 64
    assert before["fs"]["is_dir"] is True and before["fs"]["read_only"] is False
    assert before["location"] == root
    _touch(os.path.join(root, "-SEP-models-SEP-tiny@1@0@2b@bfloat16.data"), 64, 1_800_000_100)
    after, failed = run_module(tier_inventory, {"backend": "fs", "path": root, "models": ["/models/tiny"], "baseline": before})
    assert not failed
    assert after["delta"]["objects"] == 1
    assert after["delta"]["models"]["/models/tiny"] == {"objects": 1, "bytes": 64}
    assert after["delta"]["newer_than_baseline"] is True


def test_fs_missing_mount_fails_with_kind(run_module, tmp_path):
    result, failed = run_module(tier_inventory, {"backend": "fs", "path": str(tmp_path / "mnt" / "kvcache")})
    assert failed
    assert result["error"]["kind"] == "missing"
    assert result["fs"]["exists"] is False
    assert "mounted" in result["msg"]


def test_required_if(run_module):
    result, failed = run_module(tier_inventory, {"backend": "s3"})
    assert failed and "bucket" in result["msg"]


def _stubbed(monkeypatch, setup):
    made = {}

    def fake_make(**kwargs):
        c = tier.make_s3_client(**kwargs)
        made["kwargs"] = kwargs
        made["client"] = c
        stub = Stubber(c)
        setup(stub)
        stub.activate()
        return c

    monkeypatch.setattr(tier_inventory, "make_s3_client", fake_make)
    return made


def test_s3_inventory_with_stubber(run_module, monkeypatch):
    page = json.loads(_read("list_objects_v2_page2.json"))
    page.pop("_comment")
    page.pop("ContinuationToken")
    import datetime
    for obj in page["Contents"]:
        obj["LastModified"] = datetime.datetime(2026, 11, 29, 11, 30, tzinfo=datetime.timezone.utc)
    made = _stubbed(monkeypatch, lambda stub: stub.add_response("list_objects_v2", page, {"Bucket": "kvcache", "MaxKeys": 1000}))
    result, failed = run_module(tier_inventory, {
        "backend": "s3", "bucket": "kvcache", "endpoint_url": "https://s3.grid.test:10443", "access_key": "AKIDEXAMPLE",
        "secret_key": "wJalrXUtnFEMI-secret", "addressing_style": "virtual", "timeout": 3, "retries": 1,
        "ca_path": "/etc/ssl/certs/ca-certificates.crt", "models": ["Qwen/Qwen3-8B"]})
    assert not failed, result.get("msg")
    assert result["objects"] == 2
    assert result["models"]["Qwen/Qwen3-8B"]["world_sizes"] == [2]
    assert result["pages"] == 1
    assert result["location"] == "s3://kvcache/ (https://s3.grid.test:10443)"
    kw = made["kwargs"]
    assert (kw["connect_timeout"], kw["read_timeout"], kw["retries"], kw["addressing_style"]) == (3, 3, 1, "virtual")
    assert kw["ca_path"] == "/etc/ssl/certs/ca-certificates.crt"
    assert "wJalrXUtnFEMI-secret" not in json.dumps(result)


def test_s3_access_denied(run_module, monkeypatch):
    _stubbed(monkeypatch, lambda stub: stub.add_client_error("list_objects_v2", "AccessDenied", "Access Denied", 403))
    result, failed = run_module(tier_inventory, {"backend": "s3", "bucket": "kvcache", "endpoint_url": "http://127.0.0.1:9",
                                                 "access_key": "a", "secret_key": "b"})
    assert failed
    assert result["error"] == {"kind": "auth", "message": "AccessDenied (HTTP 403): Access Denied", "code": "AccessDenied", "http_status": 403}
    assert "auth" in result["msg"]


def test_s3_over_loopback_in_check_mode(run_module, static_pages):
    static_pages.pages["/kvcache"] = (200, _read("list_objects_v2.xml"), "application/xml")
    result, failed = run_module(tier_inventory, {"backend": "s3", "bucket": "kvcache", "endpoint_url": static_pages.base_url,
                                                 "addressing_style": "path", "access_key": "a", "secret_key": "b",
                                                 "models": ["/models/tiny"]}, check_mode=True)
    assert not failed, result.get("msg")
    assert result["models"]["/models/tiny"]["objects"] == 2
    assert result["newest"] == "2026-11-29T10:05:00Z"

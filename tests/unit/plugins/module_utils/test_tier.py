from __future__ import annotations

import datetime
import json
import os
import socket
import time

import pytest

from botocore import exceptions as boto_exceptions
from botocore.stub import Stubber

from ansible_collections.kvcache.offload.plugins.module_utils import tier

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures", "s3")


def s3_page(name):
    with open(os.path.join(FIX, name)) as handle:
        data = json.load(handle)
    data.pop("_comment", None)
    for obj in data.get("Contents", []):
        obj["LastModified"] = datetime.datetime.strptime(obj["LastModified"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    return data


def client(**kwargs):
    args = dict(endpoint_url="http://127.0.0.1:9", access_key="AK", secret_key="SK", connect_timeout=1, read_timeout=1, retries=1)
    args.update(kwargs)
    return tier.make_s3_client(**args)


# ----------------------------------------------------------------- names


@pytest.mark.parametrize("name,expected", [
    ("-SEP-models-SEP-tiny@1@0@1a2b3c@bfloat16.data",
     {"model": "/models/tiny", "format": "inprocess", "world_size": 1, "worker_id": 0, "chunk_hash": "1a2b3c", "dtype": "bfloat16"}),
    ("_models_tiny@2@1@-ff@half", {"model": "_models_tiny", "format": "inprocess", "world_size": 2, "worker_id": 1, "chunk_hash": "-ff"}),
    ("m@1@0@1a@bfloat16@3", {"layer_id": 3}),
    ("m@1@0@1a@bfloat16@lora%x", {"layer_id": None, "format": "inprocess"}),
    ("Qwen/Qwen3-8B@02010200@0@abcd", {"model": "Qwen/Qwen3-8B", "format": "mp", "world_size": 2, "worker_id": 1, "object_group_id": 0}),
    ("Qwen-SEP-Qwen3-8B@0x01000000@1@abcd@salt1.data", {"model": "Qwen/Qwen3-8B", "format": "mp", "world_size": 1, "object_group_id": 1}),
])
def test_parse_object_name(name, expected):
    parsed = tier.parse_object_name(name)
    assert parsed is not None
    for key, value in expected.items():
        assert parsed[key] == value, key


@pytest.mark.parametrize("name", ["foo.bin", "a@b", "m@x@y@z@bfloat16", "@1@0@1a@half", "m@1@0@zz@half"])
def test_foreign_names_are_not_parsed(name):
    assert tier.parse_object_name(name) is None


def test_model_spellings_and_match():
    assert tier.model_spellings("/m/t") == ["-SEP-m-SEP-t", "/m/t", "_m_t"]
    assert tier.match_model("_models_tiny", ["/models/tiny"]) == "/models/tiny"
    assert tier.match_model("/models/tiny", ["/models/tiny"]) == "/models/tiny"
    assert tier.match_model("other", ["/models/tiny"]) is None


# ----------------------------------------------------------------- fs


def _touch(path, size, mtime):
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)
    os.utime(path, (mtime, mtime))


def make_fs_tier(root):
    _touch(os.path.join(root, "-SEP-models-SEP-tiny@1@0@1a2b@bfloat16.data"), 100, 1_800_000_000)
    _touch(os.path.join(root, "-SEP-models-SEP-tiny@1@0@-3c4d@bfloat16.data"), 100, 1_800_000_050)
    _touch(os.path.join(root, "-SEP-models-SEP-tiny@1@0@5e6f@bfloat16.tmp"), 40, 1_800_000_060)
    _touch(os.path.join(root, "other-SEP-model@0x01000000@0@abcd.data"), 300, 1_800_000_010)
    os.mkdir(os.path.join(root, "lost+found"))
    _touch(os.path.join(root, "lost+found", "junk"), 7, 1_700_000_000)


def test_walk_fs_groups_per_model(tmp_path):
    make_fs_tier(str(tmp_path))
    inv = tier.Inventory(models=["/models/tiny", "/models/absent"])
    truncated, errors = tier.walk_fs(str(tmp_path), inv)
    res = inv.result()
    assert truncated is False and errors == []
    assert res["objects"] == 4
    assert res["bytes"] == 100 + 100 + 300 + 7
    assert res["in_flight"] == {"objects": 1, "bytes": 40}
    assert res["newest_epoch"] == 1_800_000_050
    assert res["oldest_epoch"] == 1_700_000_000
    tiny = res["models"]["/models/tiny"]
    assert (tiny["objects"], tiny["bytes"], tiny["formats"], tiny["world_sizes"], tiny["dtypes"]) == (2, 200, ["inprocess"], [1], ["bfloat16"])
    assert tiny["newest"] == "2027-01-15T08:00:50Z"
    assert res["models"]["other/model"]["formats"] == ["mp"]
    assert res["models"]["/models/absent"]["objects"] == 0
    assert res["unrecognized"] == {"objects": 1, "bytes": 7, "examples": ["lost+found/junk"]}


def test_walk_fs_truncates(tmp_path):
    make_fs_tier(str(tmp_path))
    inv = tier.Inventory()
    truncated, _errors = tier.walk_fs(str(tmp_path), inv, max_objects=2)
    assert truncated is True
    assert inv.result()["objects"] + inv.result()["in_flight"]["objects"] == 2


def test_walk_fs_missing_path(tmp_path):
    with pytest.raises(tier.TierError) as info:
        tier.walk_fs(str(tmp_path / "not-mounted"), tier.Inventory())
    assert info.value.kind == "missing"


def test_walk_fs_not_a_directory(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(tier.TierError) as info:
        tier.walk_fs(str(target), tier.Inventory())
    assert info.value.kind == "not_a_directory"


def test_fs_state(tmp_path):
    state = tier.fs_state(str(tmp_path))
    assert state["exists"] and state["is_dir"]
    assert state["read_only"] is False
    assert state["total_bytes"] > 0
    assert tier.fs_state(str(tmp_path / "nope"))["exists"] is False


def test_inventory_delta():
    before = {"objects": 2, "bytes": 200, "newest_epoch": 10.0, "models": {"m": {"objects": 2, "bytes": 200}}}
    after = {"objects": 5, "bytes": 500, "newest_epoch": 20.0, "models": {"m": {"objects": 4, "bytes": 400}, "n": {"objects": 1, "bytes": 100}}}
    d = tier.inventory_delta(after, before)
    assert d == {"objects": 3, "bytes": 300, "newer_than_baseline": True,
                 "models": {"m": {"objects": 2, "bytes": 200}, "n": {"objects": 1, "bytes": 100}}}
    assert tier.inventory_delta(after, None) is None


# ----------------------------------------------------------------- s3 (Stubber)


def test_make_s3_client_config():
    c = client(addressing_style="path", connect_timeout=3, read_timeout=4, retries=2, region="eu-1")
    cfg = c.meta.config
    assert cfg.connect_timeout == 3
    assert cfg.read_timeout == 4
    assert cfg.retries["total_max_attempts"] == 2
    assert cfg.s3["addressing_style"] == "path"
    assert c.meta.region_name == "eu-1"
    assert c.meta.endpoint_url == "http://127.0.0.1:9"


def test_list_s3_paginates_and_groups():
    c = client()
    stub = Stubber(c)
    stub.add_response("list_objects_v2", s3_page("list_objects_v2_page1.json"), {"Bucket": "kvcache", "MaxKeys": 1000})
    stub.add_response("list_objects_v2", s3_page("list_objects_v2_page2.json"),
                      {"Bucket": "kvcache", "MaxKeys": 1000, "ContinuationToken": "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="})
    inv = tier.Inventory(models=["/models/tiny"])
    with stub:
        truncated, pages = tier.list_s3(c, "kvcache", inv)
        stub.assert_no_pending_responses()
    res = inv.result()
    assert (truncated, pages) == (False, 2)
    assert res["objects"] == 5
    assert res["bytes"] == 2 * 262144 + 2 * 1048576
    assert res["models"]["/models/tiny"]["objects"] == 2  # "_models_tiny" mapped back
    qwen = res["models"]["Qwen/Qwen3-8B"]
    assert qwen["formats"] == ["mp"] and qwen["world_sizes"] == [2] and qwen["workers"] == [0, 1]
    assert res["unrecognized"]["examples"] == ["lifecycle-test/marker.txt"]
    assert res["newest"] == "2026-11-29T11:30:01Z"


def test_list_s3_prefix_and_max_objects():
    c = client()
    stub = Stubber(c)
    stub.add_response("list_objects_v2", s3_page("list_objects_v2_page1.json"), {"Bucket": "kvcache", "MaxKeys": 1000, "Prefix": "_models"})
    inv = tier.Inventory()
    with stub:
        truncated, _pages = tier.list_s3(c, "kvcache", inv, prefix="_models", max_objects=1)
    assert truncated is True
    assert inv.result()["objects"] == 1


@pytest.mark.parametrize("code,status,kind", [
    ("AccessDenied", 403, "auth"),
    ("InvalidAccessKeyId", 403, "auth"),
    ("SignatureDoesNotMatch", 403, "auth"),
    ("NoSuchBucket", 404, "not_found"),
    ("PermanentRedirect", 301, "addressing"),
    ("InternalError", 500, "s3"),
])
def test_list_s3_client_errors(code, status, kind):
    c = client()
    stub = Stubber(c)
    stub.add_client_error("list_objects_v2", service_error_code=code, service_message="msg", http_status_code=status)
    with stub, pytest.raises(tier.TierError) as info:
        tier.list_s3(c, "kvcache", tier.Inventory())
    assert info.value.kind == kind
    assert info.value.code == code
    assert info.value.http_status == status


def test_classify_transport_errors():
    dns = boto_exceptions.EndpointConnectionError(endpoint_url="http://s3.nowhere.invalid",
                                                  error=socket.gaierror(-2, "Name or service not known"))
    assert tier.classify_s3_error(dns).kind == "dns"
    refused = boto_exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1", error=ConnectionRefusedError(111, "refused"))
    assert tier.classify_s3_error(refused).kind == "connection"
    assert tier.classify_s3_error(boto_exceptions.ReadTimeoutError(endpoint_url="http://x")).kind == "timeout"
    assert tier.classify_s3_error(boto_exceptions.SSLError(endpoint_url="https://x", error="bad cert")).kind == "tls"
    assert tier.classify_s3_error(boto_exceptions.NoCredentialsError()).kind == "auth"


# ----------------------------------------------------------------- s3 (real boto3 over loopback)


def _read(name):
    with open(os.path.join(FIX, name), "rb") as handle:
        return handle.read()


def test_list_s3_over_loopback(static_pages):
    static_pages.pages["/kvcache"] = (200, _read("list_objects_v2.xml"), "application/xml")
    c = client(endpoint_url=static_pages.base_url, addressing_style="path")
    inv = tier.Inventory(models=["/models/tiny"])
    truncated, pages = tier.list_s3(c, "kvcache", inv)
    assert (truncated, pages) == (False, 1)
    assert inv.result()["models"]["/models/tiny"]["objects"] == 2
    req = static_pages.requests[0]
    assert req["path"].startswith("/kvcache?list-type=2")
    assert req["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AK/")


def test_list_s3_403_over_loopback(static_pages):
    static_pages.pages["/kvcache"] = (403, _read("access_denied.xml"), "application/xml")
    c = client(endpoint_url=static_pages.base_url, addressing_style="path")
    with pytest.raises(tier.TierError) as info:
        tier.list_s3(c, "kvcache", tier.Inventory())
    assert (info.value.kind, info.value.code, info.value.http_status) == ("auth", "AccessDenied", 403)


def test_list_s3_timeout_over_loopback(static_pages):
    static_pages.delay = 6.0  # the read timeout (0.3 s, one retry) must cut it well before
    static_pages.pages["/kvcache"] = (200, _read("list_objects_v2.xml"), "application/xml")
    c = client(endpoint_url=static_pages.base_url, addressing_style="path", read_timeout=0.3, retries=1)
    started = time.monotonic()
    with pytest.raises(tier.TierError) as info:
        tier.list_s3(c, "kvcache", tier.Inventory())
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 4.5


def test_list_s3_connection_refused(closed_port):
    c = client(endpoint_url="http://127.0.0.1:%d" % closed_port, addressing_style="path")
    with pytest.raises(tier.TierError) as info:
        tier.list_s3(c, "kvcache", tier.Inventory())
    assert info.value.kind == "connection"

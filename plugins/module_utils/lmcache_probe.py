# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Store or load a synthetic KV chunk through LMCache's own remote storage code.

SCRIPT runs with the node venv's interpreter (the one vLLM and LMCache run from). It reads
the node's LMCache config (LMCACHE_CONFIG_FILE, in-process mode: remote_url or
remote_storage_plugins), builds LMCache's StorageManager, takes its RemoteBackend and:

- store: fills a chunk shaped like the remote connector's objects with seeded random
  bfloat16 data, puts it (``submit_put_task``), waits for the put and checks ``contains``;
- load: checks ``contains`` and reads it back with ``get_blocking``;

and prints one JSON line after MARK with the sha256 of the chunk's bytes. It then closes
the StorageManager for at most CLOSE_TIMEOUT (10) seconds and exits without
waiting for LMCache's background threads: LMCache 0.5.6's S3Connector.close() never
returns, and waiting for it made every S3 probe last until its timeout. The key is
``create_test_key(model, "kvcache.offload-probe-<probe_id>")`` (world size 8, worker 0,
bfloat16), so a store on one node and a load on another address the same object.

API used (lmcache 0.5.6, the same calls as its own ``python -m lmcache.v1.basic_check``
modes): lmcache.integration.vllm.utils.lmcache_get_or_create_config,
lmcache.v1.metadata.LMCacheMetadata, lmcache.v1.check.utils.create_test_key / find_remote_backend,
lmcache.v1.storage_backend.storage_manager.StorageManager,
RemoteBackend.submit_put_task / contains / get_blocking / put_tasks / local_cpu_backend,
MemoryObj.tensor / byte_array.
"""

from __future__ import annotations

import json

MARK = "KVCACHE_OFFLOAD_PROBE_RESULT "

SCRIPT = r'''import hashlib
import json
import os
import sys
import time

MARK = "KVCACHE_OFFLOAD_PROBE_RESULT "
CLOSE_TIMEOUT = 10


def emit(data):
    sys.stdout.write(MARK + json.dumps(data) + "\n")
    sys.stdout.flush()


def main():
    args = json.loads(sys.argv[1])
    for key, value in (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("VLLM_NO_USAGE_STATS", "1")):
        os.environ[key] = value
    if args.get("config_file"):
        os.environ["LMCACHE_CONFIG_FILE"] = args["config_file"]
    out = {"action": args["action"], "probe_id": args["probe_id"]}
    try:
        cufile_stats_level3(args)
    except Exception as exc:  # noqa
        out.update(ok=False, stage="cufile_json", error="cannot make the probe's copy of %s with cufile_stats 3 "
                   "(%s: %s); cuFile reads the same file: fix it (valid JSON) and run the probe again"
                   % (args.get("cufile_json"), type(exc).__name__, exc))
        emit(out)
        return 0
    started = time.monotonic()
    try:
        import torch
        import lmcache
    except Exception as exc:  # noqa
        return import_failed(out, exc)
    out["lmcache_version"] = getattr(lmcache, "__version__", None)
    if args.get("mode") == "multiprocess":
        return l2_probe(args, out, started, torch)
    try:
        from lmcache.integration.vllm.utils import lmcache_get_or_create_config
        from lmcache.v1.check.utils import create_test_key, find_remote_backend
        from lmcache.v1.event_manager import EventManager
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.storage_manager import StorageManager
        from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
    except Exception as exc:  # noqa
        return import_failed(out, exc)
    manager = None
    try:
        config = lmcache_get_or_create_config()
        out["remote_url"] = config.remote_url
        out["remote_storage_plugins"] = getattr(config, "remote_storage_plugins", None)
        # 4 layers x 2 heads x 128 dims: a chunk is 4096 bytes per token, so every object is a
        # whole number of the 4 KiB pages LMCache allocates in. (LMCache's own test default, 1
        # layer x 1 dim, gives 1 KiB chunks in 4 KiB buffers, which S3Connector refuses:
        # "chunk size 4096 bytes does not match S3 part size 1024 bytes".)
        metadata = LMCacheMetadata(model_name=args["model"], world_size=8, local_world_size=8, worker_id=0,
                                   local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(4, 2, 256, 2, 128))
        manager = StorageManager(config=config, metadata=metadata, event_manager=EventManager())
        gds = (getattr(manager, "storage_backends", None) or {}).get("GdsBackend")
        want = args.get("backend") or "auto"
        if want == "gds" or (want == "auto" and gds is not None and find_remote_backend(manager) is None):
            return gds_io(args, out, torch, gds, create_test_key)
        backend = find_remote_backend(manager)
        if backend is None or backend.connection is None:
            out.update(ok=False, stage="connect", error="no remote backend connected (remote_url / remote_storage_plugins)")
            emit(out)
            return 0
        conn = backend.connection
        if isinstance(conn, InstrumentedRemoteConnector):
            conn = conn.getWrappedConnector()
        out["connector"] = type(conn).__name__
        key = create_test_key(args["model"], "kvcache.offload-probe-" + args["probe_id"])
        out["key"] = key.to_string()
        if args["action"] == "store":
            obj = backend.local_cpu_backend.allocate(conn.meta_shapes, conn.meta_dtypes, conn.meta_fmt)
            gen = torch.Generator().manual_seed(int(hashlib.sha256(args["probe_id"].encode()).hexdigest()[:15], 16))
            tensor = obj.tensor
            tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.dtype))
            data = bytes(obj.byte_array)
            out.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            future = backend.submit_put_task(key, obj)
            future.result(timeout=args["timeout"])
            deadline = time.monotonic() + args["timeout"]
            while backend.put_tasks and time.monotonic() < deadline:
                time.sleep(0.01)
            out["exists"] = bool(backend.contains(key))
            out["ok"] = out["exists"]
            if not out["ok"]:
                out.update(stage="store", error="the chunk is not in the remote tier after the put")
        else:
            out["exists"] = bool(backend.contains(key))
            if not out["exists"]:
                out.update(ok=False, stage="lookup", error="the chunk is not in the remote tier")
            else:
                obj = backend.get_blocking(key)
                if obj is None:
                    out.update(ok=False, stage="load", error="get returned nothing")
                else:
                    data = bytes(obj.byte_array)
                    out.update(ok=True, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    except Exception as exc:  # noqa
        storage_error(out, exc)
    finally:
        settle(out, started, manager)
    return 0


def cufile_stats_level3(args):
    """The probe's own cufile.json with profile.cufile_stats 3, so gds_stats can read this
    process's cuFile counters (posix= is compat-mode I/O). Set before cuFile loads."""
    src = args.get("cufile_json")
    stats = args.get("gds_stats")
    if not src or not stats or not os.access(stats, os.X_OK) or not os.path.isfile(src):
        return
    import tempfile
    with open(src) as handle:
        conf = json.load(handle)
    conf.setdefault("profile", {})["cufile_stats"] = 3
    fd, path = tempfile.mkstemp(prefix="kvcache-probe-cufile-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(conf, handle)
    os.environ["CUFILE_ENV_PATH_JSON"] = path


def gds_io(args, out, torch, gds, create_test_key):
    """In-process mode with GPUDirect Storage: LMCache's GdsBackend (cuFile, gds_path) stores the
    chunk from GPU memory (store) or reads it into GPU memory (load, a fresh process: the
    metadata file, then cuFile). With gds_stats, cuFile's own counters of this process follow."""
    import subprocess
    from lmcache.v1.memory_management import MemoryFormat
    out["connector"] = "GdsBackend"
    out["backend"] = "gds"
    if gds is None:
        out.update(ok=False, stage="connect", error="no GDS backend in LMCache (gds_path not set in the config)")
        return 0
    out["gds_path"] = getattr(gds, "gds_path", None)
    out["gds_fstype"] = getattr(gds, "fstype", None)
    out["use_gds"] = getattr(gds, "use_gds", None)
    out["use_direct_io"] = getattr(gds, "use_direct_io", None)
    key = create_test_key(args["model"], "kvcache.offload-probe-" + args["probe_id"])
    out["key"] = key.to_string()
    if args["action"] == "store":
        obj = gds.allocate(torch.Size([2, 4, 256, 256]), torch.bfloat16, MemoryFormat.KV_2LTD)
        if obj is None:
            out.update(ok=False, stage="store", error="the GDS buffer (gds_buffer_size) has no room for one chunk")
            return 0
        gen = torch.Generator().manual_seed(int(hashlib.sha256(args["probe_id"].encode()).hexdigest()[:15], 16))
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=gen, dtype=torch.float32).to(torch.bfloat16))
        data = obj.tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        out.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        gds.submit_put_task(key, obj).result(timeout=args["timeout"])
        deadline = time.monotonic() + args["timeout"]
        while gds.put_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        out["exists"] = bool(gds.contains(key))
        out["ok"] = out["exists"]
        if not out["ok"]:
            out.update(stage="store", error="the chunk is not in gds_path after the put")
    else:
        out["exists"] = bool(gds.contains(key))
        obj = gds.get_blocking(key) if out["exists"] else None
        if not out["exists"]:
            out.update(ok=False, stage="lookup", error="the chunk is not in gds_path")
        elif obj is None:
            out.update(ok=False, stage="load", error="get returned nothing")
        else:
            data = obj.tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            out.update(ok=True, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if args.get("gds_stats"):
        try:
            done = subprocess.run([args["gds_stats"], "-p", str(os.getpid()), "-l", "3"], capture_output=True,
                                  text=True, timeout=30, check=False)
            out["cufile_stats"] = done.stdout
        except Exception as exc:  # noqa
            out["cufile_stats_error"] = "%s: %s" % (type(exc).__name__, exc)
    return 0


def storage_error(out, exc):
    out.update(ok=False, stage=out.get("stage") or "storage", error="%s: %s" % (type(exc).__name__, exc))


def settle(out, started, closable):
    """Print the result, then close LMCache's object for at most CLOSE_TIMEOUT seconds."""
    out["elapsed"] = time.monotonic() - started
    emit(out)
    if closable is not None:
        close_bounded(closable, CLOSE_TIMEOUT)


def import_failed(out, exc):
    out.update(ok=False, stage="import", error="%s: %s" % (type(exc).__name__, exc))
    emit(out)
    return 0


def l2_probe(args, out, started, torch):
    """Multiprocess mode: the same through the L2 adapter of the node's `lmcache server`,
    built from the server's own --l2-adapter JSON (LMCACHE_L2_ADAPTER in its env file) with
    LMCache's adapter factory: the storage code the server runs. Store writes one object
    (LMCache's 0.5.6 `basic_check --mode test_l2_adapter` calls), load looks it up and reads
    it back."""
    import argparse
    import select
    adapter = None
    try:
        from lmcache.v1.distributed.api import ObjectKey
        from lmcache.v1.distributed.internal_api import L1MemoryDesc
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
        from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
        from lmcache.v1.platform import consume_fd
    except Exception as exc:  # noqa
        return import_failed(out, exc)

    def wait(efd):
        poller = select.poll()
        poller.register(efd, select.POLLIN)
        if not poller.poll(int(args["timeout"] * 1000)):
            raise TimeoutError("the L2 adapter did not answer within %s s" % args["timeout"])
        try:
            consume_fd(efd)
        except BlockingIOError:
            pass

    try:
        spec = os.environ.get("LMCACHE_L2_ADAPTER") or ""
        if not spec:
            out.update(ok=False, stage="connect", error="no LMCACHE_L2_ADAPTER in the server's env file (l2 adapter)")
            emit(out)
            return 0
        cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec]))
        parsed = json.loads(spec)
        # the lmcache role's half-open S3 adapter goes through LMCache's plugin adapter: an s3 L2 all the same
        out["remote_storage_plugins"] = ["s3" if parsed.get("type") == "plugin"
                                         and str(parsed.get("class_name", "")).endswith("S3L2Adapter")
                                         else parsed.get("type")]
        size = 256 * 1024  # float32 elements: a 1 MiB object
        buffer = torch.empty(2 * size, dtype=torch.float32)
        adapter = create_l2_adapter(cfg.adapters[0], l1_memory_desc=L1MemoryDesc(
            ptr=buffer.data_ptr(), size=buffer.numel() * buffer.element_size(), align_bytes=buffer.element_size()))
        out["connector"] = type(adapter).__name__
        digest = hashlib.sha256(("kvcache.offload-probe-" + args["probe_id"]).encode()).digest()
        key = ObjectKey(chunk_hash=digest[:16], model_name=args["model"], kv_rank=0)
        out["key"] = "%s@%s" % (args["model"], digest[:16].hex())

        def memory_obj(index):
            raw = buffer[index * size:(index + 1) * size]
            meta = MemoryObjMetadata(shape=torch.Size([size]), dtype=torch.float32, address=raw.data_ptr(),
                                     phy_size=size * raw.element_size(), fmt=MemoryFormat.KV_2LTD, ref_count=1)
            return raw, TensorMemoryObj(raw, meta, parent_allocator=None)

        if args["action"] == "store":
            raw, obj = memory_obj(0)
            gen = torch.Generator().manual_seed(int(hashlib.sha256(args["probe_id"].encode()).hexdigest()[:15], 16))
            raw.copy_(torch.randn(raw.shape, generator=gen, dtype=torch.float32))
            data = raw.numpy().tobytes()
            out.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            task = adapter.submit_store_task([key], [obj])
            wait(adapter.get_store_event_fd())
            done = adapter.pop_completed_store_tasks().get(task)
            out["ok"] = bool(done is not None and done.is_successful())
            if not out["ok"]:
                out.update(stage="store", error="the L2 adapter did not store the object")
        else:
            task = adapter.submit_lookup_and_lock_task([key], {})
            wait(adapter.get_lookup_and_lock_event_fd())
            found = adapter.query_lookup_and_lock_result(task)
            out["exists"] = bool(found is not None and found.test(0))
            if not out["exists"]:
                out.update(ok=False, stage="lookup", error="the object is not in the L2 tier")
            else:
                raw, obj = memory_obj(1)
                raw.fill_(0.0)
                task = adapter.submit_load_task([key], [obj])
                wait(adapter.get_load_event_fd())
                loaded = adapter.query_load_result(task)
                adapter.submit_unlock([key])
                if loaded is None or not loaded.test(0):
                    out.update(ok=False, stage="load", error="the L2 adapter did not load the object")
                else:
                    data = raw.numpy().tobytes()
                    out.update(ok=True, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    except Exception as exc:  # noqa
        storage_error(out, exc)
    finally:
        settle(out, started, adapter)
    return 0


def close_bounded(manager, timeout):
    """StorageManager.close(), waited for at most timeout seconds (LMCache 0.5.6's
    S3Connector.close() never returns)."""
    import threading

    def close():
        try:
            manager.close()
        except Exception:  # noqa
            pass

    worker = threading.Thread(target=close, daemon=True)
    worker.start()
    worker.join(timeout)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is printed; do not wait for LMCache's non-daemon threads (an S3 connector's
    # event loop) at interpreter exit, which can last until the module's timeout kills us.
    os._exit(code)
'''


def parse_output(stdout):
    """The last MARK line of the script's stdout as a dict, or None."""
    found = None
    for line in (stdout or "").splitlines():
        if line.startswith(MARK):
            try:
                found = json.loads(line[len(MARK):])
            except ValueError:
                continue
    return found

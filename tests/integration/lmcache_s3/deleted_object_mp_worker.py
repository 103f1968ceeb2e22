# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deleted objects behind LMCache 0.5.6's multiprocess L2 adapters, S3 and fs (run by
test_lmcache_s3_deleted_objects.py): the storage code a node's `lmcache server` runs in
multiprocess mode, the collection's default. On the s3 tier an expiration rule deletes objects,
on the fs tier the pruner (kvcache_prune) unlinks files.

Runs with an interpreter that has lmcache 0.5.6 (and boto3 for s3). Argument: one JSON object
{l2_adapter, chunks, and for s3: endpoint, bucket, access_key, secret_key}. With LMCache's adapter factory
(create_l2_adapter over the same --l2-adapter JSON the lmcache role writes, as the validation's
stage 6 probe builds it) it:

1. stores `chunks` chunks of distinct random data one at a time through the adapter and notes
   which S3 object each became;
2. deletes the FIRST chunk's object with a plain S3 client, as a bucket expiration rule does
   (fs: removes its file, as the pruner does);
3. asks the SAME adapter (the server that stored them) to look up and lock all of them, then to
   load them into zeroed buffers: which keys it says it has, which it loaded, and whether each
   loaded buffer holds its own chunk's bytes (sha256) or another's;
4. asks again (a second request for the same prefix);
5. asks a FRESH adapter (another node's server, or the same server restarted);
6. stores the chunks again through the first adapter and lists the bucket.

Prints one JSON line after MARK, then exits with os._exit (the adapters' threads are left).
"""

import argparse
import hashlib
import json
import os
import select
import sys

from worker_result import report

SIZE = 64 * 1024  # float32 elements per chunk: 256 KiB objects
TIMEOUT = 60


class Bucket:
    """The s3 tier's objects, seen with a plain S3 client (what an expiration rule deletes)."""

    def __init__(self, args):
        import boto3
        from botocore.config import Config

        self.bucket = args["bucket"]
        self.client = boto3.client("s3", endpoint_url=args["endpoint"], aws_access_key_id=args["access_key"],
                                   aws_secret_access_key=args["secret_key"], region_name="us-east-1",
                                   config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 1},
                                                 s3={"addressing_style": "path"}))

    def listed(self):
        return sorted(o["Key"] for o in self.client.list_objects_v2(Bucket=self.bucket).get("Contents", []))

    def delete(self, name):
        self.client.delete_object(Bucket=self.bucket, Key=name)


class Directory:
    """The fs tier's files (what the pruner unlinks), relative to its base path."""

    def __init__(self, base):
        self.base = base

    def listed(self):
        return sorted(os.path.relpath(os.path.join(folder, name), self.base)
                      for folder, _dirs, files in os.walk(self.base) for name in files)

    def delete(self, name):
        os.remove(os.path.join(self.base, name))


class Adapter:
    """One S3 L2 adapter built from the --l2-adapter JSON, with its own L1 buffer."""

    def __init__(self, spec, chunks, torch):
        from lmcache.v1.distributed.internal_api import L1MemoryDesc
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

        self.torch = torch
        self.buffer = torch.zeros(chunks * SIZE, dtype=torch.float32)
        cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec]))
        self.adapter = create_l2_adapter(cfg.adapters[0], l1_memory_desc=L1MemoryDesc(
            ptr=self.buffer.data_ptr(), size=self.buffer.numel() * self.buffer.element_size(),
            align_bytes=self.buffer.element_size()))

    def obj(self, index):
        from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

        raw = self.buffer[index * SIZE:(index + 1) * SIZE]
        meta = MemoryObjMetadata(shape=self.torch.Size([SIZE]), dtype=self.torch.float32, address=raw.data_ptr(),
                                 phy_size=SIZE * raw.element_size(), fmt=MemoryFormat.KV_2LTD, ref_count=1)
        return raw, TensorMemoryObj(raw, meta, parent_allocator=None)

    @staticmethod
    def wait(efd):
        from lmcache.v1.platform import consume_fd

        poller = select.poll()
        poller.register(efd, select.POLLIN)
        if not poller.poll(TIMEOUT * 1000):
            raise TimeoutError("the L2 adapter did not answer within %s s" % TIMEOUT)
        try:
            consume_fd(efd)
        except BlockingIOError:
            pass

    def store(self, keys, indexes, data):
        for key, index in zip(keys, indexes):
            raw, obj = self.obj(index)
            raw.copy_(data[index])
            task = self.adapter.submit_store_task([key], [obj])
            self.wait(self.adapter.get_store_event_fd())
            done = self.adapter.pop_completed_store_tasks().get(task)
            if done is None or not done.is_successful():
                raise RuntimeError("the L2 adapter did not store chunk %d" % index)

    def ask(self, keys, digests):
        """Lookup-and-lock, then load every key into a zeroed buffer: what the server's prefetch does."""
        task = self.adapter.submit_lookup_and_lock_task(keys, {})
        self.wait(self.adapter.get_lookup_and_lock_event_fd())
        found = self.adapter.query_lookup_and_lock_result(task)
        out = {"lookup": [bool(found is not None and found.test(i)) for i in range(len(keys))]}
        self.buffer.zero_()
        objs = [self.obj(i)[1] for i in range(len(keys))]
        task = self.adapter.submit_load_task(keys, objs)
        self.wait(self.adapter.get_load_event_fd())
        loaded = self.adapter.query_load_result(task)
        self.adapter.submit_unlock(keys)
        out["loaded"] = [bool(loaded is not None and loaded.test(i)) for i in range(len(keys))]
        got = [hashlib.sha256(self.obj(i)[0].numpy().tobytes()).hexdigest() for i in range(len(keys))]
        zero = hashlib.sha256(bytes(SIZE * 4)).hexdigest()
        # per position: 'own' (its chunk's bytes), 'zero' (untouched), or the index of another chunk's bytes
        out["content"] = ["own" if g == digests[i] else "zero" if g == zero else
                          (digests.index(g) if g in digests else "other") for i, g in enumerate(got)]
        return out


def main():
    args = json.loads(sys.argv[1])

    def body(out):
        import lmcache
        import torch
        from lmcache.v1.distributed.api import ObjectKey

        out["lmcache_version"] = lmcache.__version__
        spec = json.loads(args["l2_adapter"])
        tier = Directory(spec["base_path"]) if spec["type"] == "fs" else Bucket(args)
        chunks = int(args["chunks"])
        gen = torch.Generator().manual_seed(21)
        data = [torch.randn(SIZE, generator=gen, dtype=torch.float32) for _index in range(chunks)]
        digests = [hashlib.sha256(d.numpy().tobytes()).hexdigest() for d in data]
        keys = [ObjectKey(chunk_hash=hashlib.sha256(b"kvcache-offload-deleted-%d" % i).digest()[:16],
                          model_name="kvcache-offload-deleted", kv_rank=0) for i in range(chunks)]
        first = Adapter(args["l2_adapter"], chunks, torch)
        out["connector"] = type(first.adapter).__name__
        objects = []
        for index in range(chunks):  # one at a time: which object is whose
            first.store([keys[index]], [index], data)
            seen = {name for names in objects for name in names}
            objects.append(sorted(set(tier.listed()) - seen))
        out["stored_objects"] = objects
        out["before_delete"] = first.ask(keys, digests)
        for name in objects[0]:
            tier.delete(name)
        out["after_delete_objects"] = tier.listed()
        out["same_server"] = first.ask(keys, digests)
        out["same_server_again"] = first.ask(keys, digests)
        out["fresh_server"] = Adapter(args["l2_adapter"], chunks, torch).ask(keys, digests)
        first.store(keys, list(range(chunks)), data)
        out["after_restore_objects"] = tier.listed()
        out["after_restore"] = first.ask(keys, digests)

    report(body)


if __name__ == "__main__":
    main()

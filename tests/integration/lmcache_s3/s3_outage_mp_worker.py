# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An S3 outage behind LMCache 0.5.6's multiprocess S3 L2 adapter (issue #40 item 1): the adapter a
node's `lmcache server` builds from the --l2-adapter JSON the lmcache role writes
(roles/lmcache/vars/main.yml, __lmcache_mp_l2.s3), over a private SeaweedFS that this worker starts,
stops and starts again on the same ports and data (the store "comes back").

Runs with an interpreter that has lmcache 0.5.6 and boto3, where <bucket>.<domain> resolves to
127.0.0.1 (the caller arranges it). The S3 keys come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
as the server's unit gives them. Argument: one JSON object
{weed, work_dir, bucket, domain, outage_stores, recover_seconds, poll_seconds,
 variants: [{name, spec (extra --l2-adapter keys), breaker (true: LMCache's breaker as shipped;
 false: its threshold raised so it never trips), plugin (optional {module_path, class_name}: the
 adapter is LMCache's plugin adapter over that class, with the s3 keys as its adapter_params; the
 adapter the lmcache role ships, roles/lmcache/files/kvcache_s3_l2.py)}]}.

For each variant, with one adapter (the long-lived server's):
1. stores a chunk while the store is up;
2. stops the store, then stores `outage_stores` chunks one at a time, noting each result, how long
   it took and the adapter's report_status() (connection_failures, connection_disabled);
3. starts the store again, waits until a plain S3 client writes to it, then stores a chunk every
   `poll_seconds` for `recover_seconds` through the SAME adapter: when (if ever) it stores again;
4. stores through a FRESH adapter built from the same JSON (what the validation's probe does);
5. clears the SAME adapter's breaker flag (`_connection_disabled`, `_connection_failures`) and stores
   again: whether the awscrt client under it works, i.e. whether the breaker alone keeps it off.

Prints one JSON line after MARK, then exits with os._exit (the adapters' threads are left).
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The collection's half-open S3 adapter (roles/lmcache/files/kvcache_s3_l2.py), as the server loads it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir,
                                "roles", "lmcache", "files"))

from deleted_object_mp_worker import Adapter  # noqa: E402  (the same adapter harness)
from worker_result import report  # noqa: E402

SIZE = 64 * 1024  # float32 elements per chunk, as deleted_object_mp_worker.SIZE


def _free(port):
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _ports(count=5, low=31000, high=38000):
    for base in range(low, high, 97):
        ports = list(range(base, base + count))
        if all(_free(p) and _free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free block of ports")


class Store:
    """`weed mini` on loopback, stopped and started again on the same ports and data."""

    def __init__(self, args):
        self.weed, self.work = args["weed"], args["work_dir"]
        self.domain = args["domain"]
        self.s3_port, self.master, self.volume, self.filer, self.admin = _ports()
        self.proc = None
        for sub in ("data", "logs", "run"):
            os.makedirs(os.path.join(self.work, sub), exist_ok=True)
        self.identities = os.path.join(self.work, "identities.json")
        fd = os.open(self.identities, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"identities": [{"name": "repro", "credentials": [
                {"accessKey": os.environ["AWS_ACCESS_KEY_ID"], "secretKey": os.environ["AWS_SECRET_ACCESS_KEY"]}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, handle)

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.s3_port

    def start(self, timeout=60):
        w = self.work
        argv = [self.weed, "-logdir=%s/logs" % w, "mini", "-dir=%s/data" % w, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3.port=%d" % self.s3_port, "-master.port=%d" % self.master, "-volume.port=%d" % self.volume,
                "-filer.port=%d" % self.filer, "-admin.port=%d" % self.admin, "-master.volumeSizeLimitMB=64",
                "-s3.config=%s" % self.identities, "-s3.domainName=%s" % self.domain, "-s3.port.iceberg=0",
                "-s3.port.lance=0", "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
                "-filer.localSocket=%s/run/filer.sock" % w, "-s3.localSocket=%s/run/s3.sock" % w]
        log = open(os.path.join(w, "weed.log"), "ab")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=w, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as resp:
                    resp.read(0)
                return
            except urllib.error.HTTPError:
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError("SeaweedFS did not answer within %s s" % timeout)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        for sock in ("filer.sock", "s3.sock"):
            try:
                os.remove(os.path.join(self.work, "run", sock))
            except OSError:
                pass

    def writable(self, bucket, create=False, timeout=60):
        """Wait until a plain S3 client (boto3, path style) writes, reads and deletes an object."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                              config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30,
                                            retries={"total_max_attempts": 1}))
        if create:
            client.create_bucket(Bucket=bucket)
        deadline, error = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                client.put_object(Bucket=bucket, Key="kvcache-offload-ready", Body=b"ready")
                client.get_object(Bucket=bucket, Key="kvcache-offload-ready")["Body"].read()
                client.delete_object(Bucket=bucket, Key="kvcache-offload-ready")
                return
            except Exception as exc:  # noqa  (botocore's errors, retried until the deadline)
                error = exc
                time.sleep(0.5)
        raise RuntimeError("SeaweedFS took no write within %s s: %s" % (timeout, error))


def _store_one(adapter, key, index, data):
    """One store task through the adapter: (success, seconds)."""
    raw, obj = adapter.obj(index)
    raw.copy_(data[index])
    started = time.monotonic()
    task = adapter.adapter.submit_store_task([key], [obj])
    adapter.wait(adapter.adapter.get_store_event_fd())
    done = adapter.adapter.pop_completed_store_tasks().get(task)
    return bool(done is not None and done.is_successful()), round(time.monotonic() - started, 3)


def _status(adapter):
    said = adapter.adapter.report_status()
    return {k: said.get(k) for k in ("is_healthy", "connection_failures", "connection_disabled")}


def main():
    args = json.loads(sys.argv[1])

    def body(out):
        import hashlib

        import lmcache
        import torch
        from lmcache.v1.distributed.api import ObjectKey

        out["lmcache_version"] = lmcache.__version__
        store = Store(args)
        out["s3_port"] = store.s3_port
        store.start()
        try:
            store.writable(args["bucket"], create=True)
            gen = torch.Generator().manual_seed(40)
            data = [torch.randn(SIZE, generator=gen, dtype=torch.float32) for _i in range(4)]
            counter = [0]

            def next_key():
                counter[0] += 1
                return ObjectKey(chunk_hash=hashlib.sha256(b"kvcache-offload-outage-%d-%f" % (counter[0], time.time()))
                                 .digest()[:16], model_name="kvcache-offload-outage", kv_rank=0)

            out["variants"] = []
            for variant in args["variants"]:
                spec = dict({"type": "s3", "s3_endpoint": "%s.%s:%d" % (args["bucket"], args["domain"], store.s3_port),
                             "s3_region": "us-east-1", "disable_tls": True}, **variant.get("spec", {}))
                if variant.get("plugin"):  # the role's kvcache_s3_l2.py, through LMCache's plugin adapter
                    spec = dict(variant["plugin"], type="plugin",
                                adapter_params={k: v for k, v in spec.items() if k != "type"})
                said = {"name": variant["name"], "spec": {k: v for k, v in spec.items() if k != "s3_endpoint"}}
                out["variants"].append(said)
                first = Adapter(json.dumps(spec), 4, torch)
                if not variant.get("breaker", True):
                    first.adapter.max_connection_failures = 10 ** 9
                said["before"] = _store_one(first, next_key(), 0, data)[0]
                store.stop()
                outage = []
                for _i in range(int(args["outage_stores"])):
                    ok, took = _store_one(first, next_key(), 1, data)
                    outage.append(dict(ok=ok, seconds=took, **_status(first)))
                said["outage"] = outage
                store.start()
                store.writable(args["bucket"])
                back = time.monotonic()
                said["store_back"] = time.strftime("%H:%M:%S")
                polls, recovered = [], None
                while time.monotonic() - back < float(args["recover_seconds"]):
                    ok, took = _store_one(first, next_key(), 2, data)
                    polls.append(dict(after=round(time.monotonic() - back, 1), ok=ok, seconds=took, **_status(first)))
                    if ok:
                        recovered = polls[-1]["after"]
                        break
                    time.sleep(float(args["poll_seconds"]))
                said["after_back"] = polls
                said["same_adapter_recovered_after"] = recovered
                said["fresh_adapter"] = _store_one(Adapter(json.dumps(spec), 4, torch), next_key(), 3, data)[0]
                first.adapter._connection_disabled = False  # pylint: disable=protected-access
                first.adapter._connection_failures = 0  # pylint: disable=protected-access
                said["same_adapter_breaker_cleared"] = _store_one(first, next_key(), 2, data)[0]
        finally:
            store.stop()

    report(body)


if __name__ == "__main__":
    main()

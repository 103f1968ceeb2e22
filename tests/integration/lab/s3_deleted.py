"""Objects deleted behind a running LMCache server on the lab's S3 tier (issue #21 item 5), end to end.

Used by test_switches.py while the lab runs on the s3 tier. On the first node:

1. a new prompt is computed (temperature 0); its server stores the complete chunks in its L1
   and in the bucket (SeaweedFS, the lab's StorageGRID stand-in);
2. the prompt's new objects are deleted from the bucket with a plain S3 client, as an
   expiration rule deletes them; the server still has their sizes cached (it stored them);
3. the node's engine is restarted (vLLM's own prefix cache is gone) and the server's L1 is
   cleared (POST /cache/clear on its loopback admin port), so the only copy LMCache knows of
   is the deleted one in L2;
4. the same prompt again: LMCache's server must not hand vLLM KV it does not have - the
   answer is the cold one, and the objects come back (the recomputed chunks are stored again).

The numbers come from the server's own /metrics (read inside the node: it listens on loopback)
and vLLM's, before and after the repeated request.
"""
import json
import time

import boto3
import botocore.config

from labutil import docker_exec, http, metric

SERVER = "http://127.0.0.1:8080"
# Runs with the node's own python3 inside the container: the server listens on loopback.
_HTTP = ("import sys, urllib.request\n"
         "req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode() if len(sys.argv) > 2 else None,\n"
         "                             headers={'Content-Type': 'application/json'})\n"
         "print(urllib.request.urlopen(req, timeout=20).read().decode())\n")
SERVER_COUNTERS = ("lmcache_mp_lookup_hit_l2_tokens", "lmcache_mp_l2_prefetch_failure_chunks",
                   "lmcache_mp_l2_prefetch_load_completed_chunks", "lmcache_mp_lookup_requested_tokens")


def s3_client(hostvars, s3_host, keys):
    return boto3.client(
        "s3", endpoint_url="http://%s:8333" % hostvars[s3_host]["ansible_host"], region_name="us-east-1",
        aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
        config=botocore.config.Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2}))


def objects(client, bucket):
    names, token = set(), None
    while True:
        kwargs = {"Bucket": bucket, "MaxKeys": 1000}
        if token:
            kwargs["ContinuationToken"] = token
        page = client.list_objects_v2(**kwargs)
        names.update(o["Key"] for o in page.get("Contents", []))
        if not page.get("IsTruncated"):
            return names
        token = page.get("NextContinuationToken")


def server_counters(container):
    """The LMCache server's counters that matter here (sums over their labels; missing = 0)."""
    text = docker_exec(container, "python3", "-c", _HTTP, SERVER + "/metrics", timeout=40).stdout
    out = dict.fromkeys(SERVER_COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for counter in SERVER_COUNTERS:
            if name in (counter, counter + "_total"):
                out[counter] += float(line.rsplit(" ", 1)[1])
    return out


def chat(url, api_key, model, prompt):
    status, text = http(url + "/v1/chat/completions",
                        {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4,
                         "temperature": 0}, key=api_key, timeout=180)
    assert status == 200, (status, text[:300])
    body = json.loads(text)
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]


def wait_for(predicate, timeout, step=1.0):
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step)
        value = predicate()
    return value


def deleted_objects_scenario(instance, client, bucket, api_key, model, wait_healthy, tag):
    """Run the scenario on one instance; returns what was measured (asserted by the caller)."""
    _host, container, inst, url = instance
    prompt = "Deleted-object test %s. Answer in one word. %s" % (
        tag, " ".join("%s-%d" % (tag, i) for i in range(200)))
    out = {}
    before = objects(client, bucket)
    out["cold_answer"], out["prompt_tokens"] = chat(url, api_key, model, prompt)
    # The server stores asynchronously: wait until the prompt's objects are all in the bucket.
    stored = []

    def settled():
        new = objects(client, bucket) - before
        stored.append(len(new))
        return new if len(stored) > 2 and stored[-1] == stored[-2] == stored[-3] and new else None
    out["stored"] = sorted(wait_for(settled, 60) or [])
    for name in out["stored"]:
        client.delete_object(Bucket=bucket, Key=name)
    out["left_after_delete"] = sorted(set(out["stored"]) & objects(client, bucket))
    # vLLM's own prefix cache goes with the engine; the server (and its S3 size cache) stays.
    unit = "kvcache-vllm@%s.service" % inst["name"]
    server_pid = docker_exec(container, "systemctl", "show", "-p", "MainPID", "--value", "kvcache-lmcache.service").stdout
    docker_exec(container, "systemctl", "restart", unit, timeout=300)
    out["engine_healthy"] = wait_healthy([url])
    out["server_kept"] = server_pid == docker_exec(
        container, "systemctl", "show", "-p", "MainPID", "--value", "kvcache-lmcache.service").stdout
    out["l1_cleared"] = json.loads(docker_exec(container, "python3", "-c", _HTTP, SERVER + "/cache/clear",
                                               json.dumps({"tier": "l1", "force": True}), timeout=40).stdout)
    counters = server_counters(container)
    external = metric(url, "vllm:prompt_tokens_by_source", {"source": "external_kv_transfer"})
    out["again_answer"], _tokens = chat(url, api_key, model, prompt)
    after = server_counters(container)
    out["server"] = {k: after[k] - counters[k] for k in SERVER_COUNTERS}
    out["external_kv_tokens"] = metric(url, "vllm:prompt_tokens_by_source", {"source": "external_kv_transfer"}) - external
    wait_for(lambda: set(out["stored"]) <= objects(client, bucket), 60)
    out["restored"] = sorted(set(out["stored"]) & objects(client, bucket))
    return out

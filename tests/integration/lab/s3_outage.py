"""An S3 outage behind the lab's LMCache servers, and the tier coming back by itself (issue #40 item 4).

Used by test_switches.py while the lab runs on the s3 tier:

1. the lab's S3 store (SeaweedFS, StorageGRID's stand-in) is stopped;
2. new prompts go to every engine directly, so each node's LMCache server submits stores that
   fail, until every server's S3 adapter reports its circuit breaker open (GET /status on the
   server's loopback admin port: `l2_adapters[].connection_disabled`), as a StorageGRID outage of
   15-25 s does;
3. the store is started again, and prompts keep going to the engines, until every server's
   adapter is closed again (no breaker open, no connection failure counted) and a new prompt's
   objects land in the bucket. Nothing is restarted: each server keeps its main PID.

With LMCache 0.5.6's own adapter (lmcache_s3_retry_after_seconds: 0) step 3 never ends: its
breaker never closes (docs/notes/lmcache-s3-recovery.md), which is how this failed on the code
before the collection's half-open adapter (roles/lmcache/files/kvcache_s3_l2.py).
"""
import json
import time
import uuid

from faultutil import set_s3_store, wait_s3
from labutil import docker_exec, http

STATUS_URL = "http://127.0.0.1:8080/status"
_GET = ("import sys, urllib.request\n"
        "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n")


def server_status(container):
    """The S3 adapters' state in the node's LMCache server: [{type, connection_disabled, connection_failures}]."""
    out = docker_exec(container, "python3", "-c", _GET, STATUS_URL, timeout=40, check=False).stdout
    try:
        data = json.loads(out)
    except ValueError:
        return None
    return [{k: a.get(k) for k in ("type", "connection_disabled", "connection_failures", "half_open")}
            for a in (data.get("storage_manager") or {}).get("l2_adapters") or []]


def server_pid(container):
    return docker_exec(container, "systemctl", "show", "-p", "MainPID", "--value", "kvcache-lmcache.service").stdout.strip()


def _prompt(tag):
    # about 2500 tokens of the tiny model with a short tag (the lab's context is 8192): complete
    # 256-token chunks to store. A longer tag makes a longer prompt: keep tags short.
    return " ".join("outage-%s-%d" % (tag, i) for i in range(350))


def _ask(url, api_key, model, tag):
    return http(url + "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": _prompt(tag)}], "max_tokens": 1,
                 "temperature": 0}, key=api_key, timeout=120)[0]


def _until(nodes, done, timeout, ask, answers):
    """Send a prompt to every engine of each node not yet done, then read its server's S3 adapters,
    until done(adapters) holds on every node or timeout s pass; {container: seconds it took}."""
    started = time.monotonic()
    reached = {}
    while time.monotonic() - started < timeout and len(reached) < len(nodes):
        for container, urls in nodes.items():
            if container in reached:
                continue
            for url in urls:
                answers.append(ask(url))
            status = server_status(container)
            if status and done(status):
                reached[container] = round(time.monotonic() - started, 1)
        time.sleep(2)
    return reached


def outage_scenario(instances, hostvars, s3_host, keys, s3, bucket, api_key, model,
                    trip_timeout=180, recover_timeout=180):
    """Run the outage; a dict of what was seen (the caller asserts)."""
    nodes = {}
    for _host, container, _inst, url in instances:
        nodes.setdefault(container, []).append(url)
    seen = {"pids_before": {c: server_pid(c) for c in nodes}, "requests_down": [], "requests_back": []}
    run = uuid.uuid4().hex[:8]
    count = [0]

    def ask(url):
        count[0] += 1
        return _ask(url, api_key, model, "%s-%d" % (run, count[0]))

    store = hostvars[s3_host]["ansible_docker_host"]
    set_s3_store(store, False)
    try:
        seen["tripped_after"] = _until(nodes, lambda adapters: any(a.get("connection_disabled") for a in adapters),
                                       trip_timeout, ask, seen["requests_down"])
    finally:
        set_s3_store(store, True)
    seen["store_back"] = wait_s3(hostvars, s3_host, keys, "ok", timeout=120)
    seen["recovered_after"] = _until(
        nodes, lambda adapters: not any(a.get("connection_disabled") or a.get("connection_failures") for a in adapters),
        recover_timeout, ask, seen["requests_back"])
    seen["status_after"] = {c: server_status(c) for c in nodes}
    # a new prompt's objects reach the bucket again, through each node's own server
    before = len(list(_keys(s3, bucket)))
    for index, urls in enumerate(nodes.values()):
        seen["requests_back"].append(_ask(urls[0], api_key, model, "%s-a%d" % (run, index)))
    deadline = time.monotonic() + 60
    added = 0
    while time.monotonic() < deadline:
        added = len(list(_keys(s3, bucket))) - before
        if added >= 2 * len(nodes):
            break
        time.sleep(2)
    seen["objects_added_after"] = added
    seen["pids_after"] = {c: server_pid(c) for c in nodes}
    return seen


def _keys(s3, bucket):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents") or []:
            yield item["Key"]

"""The nodes stage in the lab: real vLLM (CPU build) instances under systemd.

Asserts real state on the lab's containers: unit and settings files with their modes,
`systemctl is-active`, /health, the API key enforced (401 without it, 200 with it),
the key kept out of units, `systemctl show`, the journal and command lines, and KV
computed on one instance served to the other from the shared tier.
"""
import json
import os
import time

from labutil import ROOT, docker_exec, http, metric

CONF_DIR = "/etc/kvcache/vllm"
# The fleet's hash seed: a secret the lab generates once (inventories/lab/group_vars/all/kvcache.yml).
HASH_SEED_FILE = os.path.join(ROOT, "build", "lab", "secrets", "hash-seed")


def _lab_hash_seed():
    with open(HASH_SEED_FILE, encoding="utf-8") as handle:
        return str(int(handle.read().strip()))


def test_units_and_files(instances):
    for host, container, inst, dummy in instances:
        unit = docker_exec(container, "systemctl", "cat", "kvcache-vllm@%s.service" % inst["name"]).stdout
        assert "EnvironmentFile=%s/api-key.env" % CONF_DIR in unit
        assert "VLLM_API_KEY" not in unit
        assert "Restart=always" in unit
        assert "RequiresMountsFor=/mnt/kvcache" in unit
        # LMCache's multiprocess server holds the engines' KV registration: they restart with it
        assert "PartOf=kvcache-lmcache.service" in unit and "Requires=kvcache-lmcache.service" in unit
        modes = docker_exec(container, "stat", "-c", "%a %U %G %n",
                            "%s/api-key.env" % CONF_DIR, "%s/%s.env" % (CONF_DIR, inst["name"])).stdout.split("\n")
        assert modes[0].startswith("600 root root"), "%s: %s" % (host, modes[0])
        assert modes[1].startswith("640 root kvcache"), "%s: %s" % (host, modes[1])
        env = docker_exec(container, "cat", "%s/%s.env" % (CONF_DIR, inst["name"])).stdout
        for line in ("LMCACHE_TRACK_USAGE=false", "DO_NOT_TRACK=1", "VLLM_NO_USAGE_STATS=1",
                     "PYTHONHASHSEED=%s" % _lab_hash_seed(), "HF_HUB_OFFLINE=1"):
            assert line in env.splitlines(), "%s: %s missing from the instance settings" % (host, line)
        assert "PROMETHEUS_MULTIPROC_DIR=/run/kvcache-vllm-%s/prometheus" % inst["name"] in env
        assert '"kv_load_failure_policy":"recompute"' in env


def test_instances_are_active_and_healthy(instances):
    for host, container, inst, url in instances:
        state = docker_exec(container, "systemctl", "is-active", "kvcache-vllm@%s.service" % inst["name"],
                            check=False).stdout.strip()
        assert state == "active", "%s: instance %s is %s" % (host, inst["name"], state)
        status = http(url + "/health")[0]
        assert status == 200, "%s: /health answered %s" % (host, status)


def test_api_key_is_enforced(instances, api_key, hostvars):
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    for host, dummy, dummy2, url in instances:
        status = http(url + "/v1/chat/completions", body)[0]
        assert status == 401, "%s: a request without the key got %s" % (host, status)
        status = http(url + "/v1/chat/completions", body, key="wrong-" + api_key)[0]
        assert status == 401, "%s: a request with a wrong key got %s" % (host, status)
        status, text = http(url + "/v1/chat/completions", body, key=api_key)
        assert status == 200, "%s: a request with the key got %s: %s" % (host, status, text[:200])
        assert json.loads(text)["choices"], text


def test_api_key_stays_secret(instances, api_key):
    for host, container, inst, dummy in instances:
        unit = "kvcache-vllm@%s.service" % inst["name"]
        for argv in (["systemctl", "show", unit], ["systemctl", "cat", unit],
                     ["journalctl", "--no-pager", "-u", unit],
                     ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"],
                     ["cat", "%s/%s.env" % (CONF_DIR, inst["name"])]):
            out = docker_exec(container, *argv, check=False).stdout
            assert api_key not in out, "%s: the API key shows in `%s`" % (host, " ".join(argv))


def _tier_chunks(container, path="/mnt/kvcache"):
    """How many LMCache chunk files (*.data) the shared tier holds."""
    out = docker_exec(container, "find", path, "-maxdepth", "1", "-name", "*.data", "-type", "f").stdout
    return len(out.split())


def test_kv_from_instance_a_is_a_hit_on_instance_b(instances, api_key, hostvars):
    """A long prompt on A writes KV to the shared tier; the same prompt on B loads it."""
    url_a, url_b = instances[0][3], instances[1][3]
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    marker = "run %d " % time.time_ns()
    prompt = marker + " ".join("the shared prefix of document %d talks about cache tiers." % i for i in range(120))
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    source = "vllm:prompt_tokens_by_source_total"
    before = metric(url_b, source, {"source": "external_kv_transfer"})
    container_a = instances[0][1]
    chunks_before = _tier_chunks(container_a)
    status, text = http(url_a + "/v1/chat/completions", body, key=api_key, timeout=120)
    assert status == 200, text[:300]
    # LMCache's server writes to its L2 (the shared tier) after the request: wait for it.
    deadline = time.monotonic() + 60
    while _tier_chunks(container_a) <= chunks_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _tier_chunks(container_a) > chunks_before, "instance A's KV did not reach the shared tier in 60 s"
    status, text = http(url_b + "/v1/chat/completions", body, key=api_key, timeout=120)
    assert status == 200, text[:300]
    after = metric(url_b, source, {"source": "external_kv_transfer"})
    assert after - before >= 256, (
        "instance B loaded %s tokens from the shared tier (expected the prompt's KV, >= 256)" % (after - before))

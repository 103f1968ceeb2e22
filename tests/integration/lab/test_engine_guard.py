"""Issue #32 item 2 and the /invocations finding: an engine answers nothing without the API key
but a GET of its open paths (/health, /metrics), and an instance's worker processes listen on
loopback only. Against today's lab (vLLM 0.32's CPU build): before the engine guard, POST
/invocations answered a chat completion without a key, and each node's VLLM::Worker listened on
about 13 ports of its fleet address (torch.distributed's gloo pairs)."""
import json

from labutil import docker_exec, http

# Paths vLLM 0.32 serves (or routes) outside /v1, none of which its own --api-key guards, and two
# under /v1 that it does: every one must answer 401 without the key, whatever the method.
GUARDED = ["/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/classify",
           "/version", "/server_info", "/load", "/ping", "/reset_prefix_cache", "/docs", "/openapi.json",
           "/v1/models", "/v1/chat/completions"]

# The TCP listeners of the node and the process behind each, read as the service user (root in a
# lab container may not read another user's /proc/<pid>/fd): "address:port pid comm" lines.
LISTENERS = r'''
import glob, os, re, socket, struct
listen = {}
for path, fam in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(path).readlines()[1:]:
        f = line.split()
        if f[3] != "0A":
            continue
        addr, port = f[1].split(":")
        raw = b"".join(struct.pack("<I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
        listen[f[9]] = (socket.inet_ntop(fam, raw), int(port, 16))
for proc in glob.glob("/proc/[0-9]*"):
    try:
        comm = open(proc + "/comm").read().strip()
        for fd in os.listdir(proc + "/fd"):
            m = re.match(r"socket:\[(\d+)\]", os.readlink(proc + "/fd/" + fd))
            if m and m.group(1) in listen:
                print("%s %d %s %s" % (listen[m.group(1)] + (proc[6:], comm)))
    except OSError:
        pass
'''


def _body(hostvars, instances):
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def test_no_path_answers_without_the_key(instances, hostvars, api_key):
    body = _body(hostvars, instances)
    for host, dummy, dummy2, url in instances:
        for path in GUARDED:
            for payload in (body, None):  # a JSON POST, then a GET
                status, text = http(url + path, payload, timeout=30)
                assert status == 401, "%s: %s %s without the key answered %s: %s" % (
                    host, "POST" if payload else "GET", path, status, text[:200])
            status = http(url + path, body, key="wrong-" + api_key, timeout=30)[0]
            assert status == 401, "%s: POST %s with a wrong key answered %s" % (host, path, status)


def test_the_key_opens_the_other_paths_as_before(instances, hostvars, api_key):
    body = _body(hostvars, instances)
    for host, dummy, dummy2, url in instances:
        status, text = http(url + "/invocations", body, key=api_key, timeout=120)
        assert status == 200 and json.loads(text)["choices"], "%s: /invocations with the key: %s %s" % (
            host, status, text[:200])
        status, text = http(url + "/tokenize", {"model": body["model"], "prompt": "hello"}, key=api_key)
        assert status == 200 and json.loads(text)["tokens"], "%s: /tokenize with the key: %s" % (host, status)


def test_health_and_metrics_answer_a_get_without_the_key_and_nothing_else(instances):
    for host, dummy, dummy2, url in instances:
        assert http(url + "/health")[0] == 200, host
        status, text = http(url + "/metrics")
        assert status == 200 and "vllm:" in text, (host, status)
        for path in ("/health", "/metrics"):
            assert http(url + path, {})[0] == 401, "%s: POST %s without the key" % (host, path)


def test_only_the_api_port_listens_off_loopback(instances, hostvars):
    """Every listener of the engines' processes (the service user's) that is not on loopback is an
    instance's API port: torch.distributed, gloo and vLLM's queues bind to 127.0.0.1."""
    nodes = {}
    for host, container, inst, dummy in instances:
        nodes.setdefault((host, container), set()).add(int(inst["port"]))
    for (host, container), ports in nodes.items():
        out = docker_exec(container, "runuser", "-u", hostvars[host].get("kvcache_service_user", "kvcache"), "--",
                          "python3", "-c", LISTENERS).stdout
        rows = [line.split() for line in out.splitlines() if line.strip()]
        workers = [r for r in rows if r[3].startswith("VLLM")]
        assert workers, "%s: no VLLM:: process listens at all (read as the service user): %s" % (host, out)
        exposed = [r for r in rows if not r[0].startswith("127.") and r[0] != "::1"]
        assert sorted(int(r[1]) for r in exposed) == sorted(ports), (
            "%s: listeners off loopback other than the API ports %s: %s" % (host, sorted(ports), exposed))

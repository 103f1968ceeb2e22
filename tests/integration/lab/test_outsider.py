"""A host on the fleet network that is not in the inventory gets nothing but the client endpoint.

Issue #32 item 6: plays the attacker of the issue's first paragraph. A container on the lab's
own network (the lab image, an address no lab host has) that is in no inventory group and
holds no credential:

- asks the router's worker API to add itself (POST /add_worker?url=<itself>), to list and to
  remove workers: refused, and the router's own worker list (read on the router host, on its
  loopback admin address) still names exactly the fleet's instances;
- asks for inference on every path it can think of without a key, at the router (/v1/...,
  /invocations, /v2/..., /inference/...) and at every engine port: nothing answers with a
  completion (the engines' ports do not even accept its connection);
- tries every TCP port any lab host listens on (read with `ss -ltn` inside each host, so a new
  listener is tried the day it appears, loopback ones excepted): only the router's client port
  accepts it;
- the client endpoint speaks TLS with a certificate that verifies against the lab CA (and the
  host name in it), and plain HTTP to it gets no answer with content.

It also holds docs/security.md's listener table against what the lab hosts listen on: every
listener a lab host has is in the table, with the bind it really has (loopback or the fleet
address), and every row the table gives for the lab is listening.

Wall time: about 30 s (one short-lived container; connection attempts time out after 2 s,
at most a few dozen of them, run in parallel inside the container).
"""
import json
import os
import re
import subprocess

import pytest

from labutil import ROOT, container_name, docker_exec, group_hosts

OUTSIDER_IP = "172.29.100.99"
OUTSIDER_NAME = "kvcache-lab-outsider"
SECURITY_DOC = os.path.join(ROOT, "docs", "security.md")

# Runs inside the outsider: reads a JSON plan on stdin, prints a JSON result.
# plan: {"tcp": [[host, port], ...], "http": [{"id", "url", "method", "body", "headers", "ca"}], "tls": {...}}
PROBE = r"""
import concurrent.futures, http.client, json, socket, ssl, sys, urllib.parse
plan = json.load(sys.stdin)

def tcp(target):
    host, port = target
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect((host, port))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return "error: %s" % exc
    finally:
        s.close()

def request(item):
    u = urllib.parse.urlsplit(item["url"])
    try:
        if u.scheme == "https":
            ctx = ssl.create_default_context(cadata=item.get("ca") or None)
            if not item.get("ca"):
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=10, context=ctx)
        else:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        path = u.path + ("?" + u.query if u.query else "")
        body = json.dumps(item["body"]).encode() if item.get("body") is not None else None
        headers = dict(item.get("headers") or {})
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(item.get("method", "GET"), path or "/", body=body, headers=headers)
        resp = conn.getresponse()
        return {"status": resp.status, "body": resp.read(4096).decode("utf-8", "replace")}
    except Exception as exc:  # every failure is an answer here: what matters is no content
        return {"status": None, "error": "%s: %s" % (type(exc).__name__, exc)}

def tls(item):
    try:
        ctx = ssl.create_default_context(cadata=item["ca"] or None)
        with socket.create_connection((item["host"], item["port"]), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=item["server_hostname"]) as s:
                return {"verified": True, "version": s.version(), "subject": dict(x[0] for x in s.getpeercert()["subject"])}
    except Exception as exc:
        return {"verified": False, "error": "%s: %s" % (type(exc).__name__, exc)}

with concurrent.futures.ThreadPoolExecutor(16) as pool:
    tcp_results = list(pool.map(tcp, [tuple(t) for t in plan["tcp"]]))
    http_results = list(pool.map(request, plan["http"]))
out = {
    "tcp": [[h, p, r] for (h, p), r in zip(plan["tcp"], tcp_results)],
    "http": {item["id"]: r for item, r in zip(plan["http"], http_results)},
    "tls": tls(plan["tls"]) if plan.get("tls") else None,
}
print(json.dumps(out))
"""

# Paths that serve inference on vLLM or on a router, besides the OpenAI ones.
INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/invocations", "/v2/chat/completions",
                   "/inference/v1/generate", "/generate", "/v1/responses", "/pooling", "/classify", "/score")


def _listeners(container):
    """(address, port) of every TCP socket listening in the container."""
    out = docker_exec(container, "ss", "-ltnH", timeout=30).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        addr, _sep, port = local.rpartition(":")
        addr = addr.strip("[]").split("%")[0]
        found.add((addr, int(port)))
    return found


def _loopback(addr):
    return addr.startswith("127.") or addr == "::1"


@pytest.fixture(scope="module")
def lab_network(hostvars):
    """The lab's docker network, read from the lab's own settings (inventories/lab)."""
    any_host = next(iter(hostvars.values()))
    return any_host["kvcache_lab_network"]["name"], any_host["kvcache_lab_image"]


@pytest.fixture(scope="module")
def listeners(inventory, hostvars):
    """host -> {(addr, port)} for every lab container."""
    return {host: _listeners(container_name(hostvars, host)) for host in group_hosts(inventory, "kvcache_lab")}


@pytest.fixture(scope="module")
def probe(inventory, hostvars, lab_network, listeners, lab_router, api_key, instances):
    """Everything the outsider tries, in one container run."""
    network, image = lab_network
    taken = {hostvars[h].get("ansible_host") for h in hostvars}
    assert OUTSIDER_IP not in taken, "the outsider's address belongs to a lab host"
    ca = ""
    if lab_router.ca_file:
        with open(lab_router.ca_file, encoding="utf-8") as handle:
            ca = handle.read()
    router_host = group_hosts(inventory, "kvcache_router")[0]
    router_addr = hostvars[router_host]["ansible_host"]
    router_port = int(lab_router.url.rsplit(":", 1)[1].split("/")[0])
    # Every non-loopback listener of every lab host, plus every engine's port.
    targets = set()
    for host, found in listeners.items():
        for addr, port in found:
            if not _loopback(addr):
                targets.add((hostvars[host]["ansible_host"], port))
    for _host, _container, inst, url in instances:
        hostport = url.split("//", 1)[1]
        targets.add((hostport.rsplit(":", 1)[0], int(hostport.rsplit(":", 1)[1])))
    chat = {"model": hostvars[group_hosts(inventory, "kvcache_nodes")[0]]["kvcache_served_model_name"],
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    requests_ = []
    me = "http://%s:8000" % OUTSIDER_IP
    for scheme_url in (lab_router.url, lab_router.url.replace("https://", "http://")):
        tag = "https" if scheme_url.startswith("https") else "http"
        requests_ += [
            {"id": "%s add_worker" % tag, "url": scheme_url + "/add_worker?url=" + me, "method": "POST"},
            {"id": "%s list_workers" % tag, "url": scheme_url + "/list_workers"},
            {"id": "%s remove_worker" % tag, "url": scheme_url + "/remove_worker?url=" + instances[0][3], "method": "POST"},
            {"id": "%s metrics" % tag, "url": scheme_url + "/metrics"},
        ]
        for path in INFERENCE_PATHS:
            requests_.append({"id": "%s router %s" % (tag, path), "url": scheme_url + path, "method": "POST", "body": chat})
        # The engines' key is not a client key: at the router it opens nothing either.
        requests_.append({"id": "%s router engine key" % tag, "url": scheme_url + "/v1/chat/completions",
                          "method": "POST", "body": chat, "headers": {"Authorization": "Bearer " + api_key}})
    for i, item in enumerate(requests_):
        if item["url"].startswith("https"):
            item["ca"] = ca
    for _host, _container, inst, url in instances:
        for path in INFERENCE_PATHS:
            requests_.append({"id": "engine %s %s" % (url, path), "url": url + path, "method": "POST", "body": chat})
    plan = {"tcp": sorted(targets), "http": requests_,
            "tls": {"host": router_addr, "port": router_port, "server_hostname": router_addr, "ca": ca}}
    subprocess.run(["docker", "rm", "-f", OUTSIDER_NAME], capture_output=True, timeout=60, check=False)
    proc = subprocess.run(
        ["docker", "run", "--rm", "-i", "--name", OUTSIDER_NAME, "--network", network, "--ip", OUTSIDER_IP,
         "--entrypoint", "python3", image, "-c", PROBE],
        input=json.dumps(plan), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["router"] = (router_addr, router_port)
    return result


def test_the_router_worker_api_refuses_the_outsider(probe, inventory, hostvars, instances):
    for tag in ("https", "http"):
        for what in ("add_worker", "list_workers", "remove_worker", "metrics"):
            answer = probe["http"]["%s %s" % (tag, what)]
            assert answer["status"] is None or answer["status"] >= 400, (tag, what, answer)
            assert "worker" not in (answer.get("body") or "").lower() or answer["status"] >= 400, (tag, what, answer)
    # The router's own list, asked on its host over loopback: the fleet's instances, no outsider.
    router_host = group_hosts(inventory, "kvcache_router")[0]
    container = container_name(hostvars, router_host)
    out = docker_exec(container, "sh", "-c", "ss -ltnH", timeout=30).stdout
    admin = sorted({int(m) for m in re.findall(r"127\.0\.0\.1:(\d+)", out)})
    assert admin, "the router host has no loopback listener: where is the router's worker API?"
    lists = []
    for port in admin:
        res = docker_exec(container, "python3", "-c",
                          "import urllib.request,sys\n"
                          "try:\n print(urllib.request.urlopen('http://127.0.0.1:%d/list_workers', timeout=5).read().decode())\n"
                          "except Exception as e:\n print('')" % port, timeout=30, check=False)
        if '"urls"' in res.stdout or "workers" in res.stdout:
            lists.append(res.stdout)
    assert lists, "no loopback listener of the router host answers /list_workers"
    assert OUTSIDER_IP not in "".join(lists), lists
    for _host, _container, _inst, url in instances:
        assert url in "".join(lists), (url, lists)


def test_no_path_gives_inference_without_the_key(probe):
    served = {}
    for key, answer in probe["http"].items():
        if " router " in key or key.startswith("engine "):
            body = answer.get("body") or ""
            if answer.get("status") == 200 or '"choices"' in body or '"text"' in body:
                served[key] = answer
    assert not served, served


def test_the_engines_do_not_accept_the_outsiders_connections(probe, instances):
    engines = {(url.split("//", 1)[1].rsplit(":", 1)[0], int(url.rsplit(":", 1)[1])) for _h, _c, _i, url in instances}
    open_ = [t for t in probe["tcp"] if (t[0], t[1]) in engines and t[2] == "open"]
    assert not open_, open_


def test_only_the_router_client_port_is_reachable(probe):
    router = tuple(probe["router"])
    reachable = sorted((h, p) for h, p, r in probe["tcp"] if r == "open")
    assert reachable == [router], "reachable from a host outside the inventory: %s (allowed: %s)" % (reachable, [router])


def test_the_client_endpoint_speaks_tls_verified_by_the_lab_ca(probe):
    tls = probe["tls"]
    assert tls["verified"], tls
    assert tls["version"] in ("TLSv1.2", "TLSv1.3"), tls
    # Plain HTTP to the TLS port gets no content (nginx answers 400 "plain HTTP to HTTPS port").
    plain = probe["http"]["http router /v1/chat/completions"]
    assert plain.get("status") in (None, 400), plain


def _doc_listener_rows():
    """Rows of docs/security.md's listener table: (group, lab ports or 'ephemeral', bind, row text).

    The port cell names the variable and gives its lab value: "`router_port` (lab: 8001)",
    or plain numbers ("8333"), or "ephemeral" (the kernel's ephemeral range, 32768 and up)."""
    with open(SECURITY_DOC, encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Listeners", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[0].startswith("`kvcache_"):
            continue
        port = cells[1]
        if "ephemeral" in port:
            ports = "ephemeral"
        else:
            lab = re.search(r"\(lab: ([\d, ]+)\)", port)
            ports = {int(n) for n in re.findall(r"\d+", lab.group(1) if lab else port)}
        rows.append((cells[0].strip("`"), ports, cells[3], " | ".join(cells)))
    assert rows, "docs/security.md has no listener rows"
    return rows


def _port_matches(ports, port):
    return port >= 32768 if ports == "ephemeral" else port in ports


def test_the_listener_table_holds_what_the_lab_listens_on(inventory, listeners):
    rows = _doc_listener_rows()
    unknown, wrong_bind = [], []
    for host, found in listeners.items():
        groups = [g for g in ("kvcache_nodes", "kvcache_router", "kvcache_s3_store", "kvcache_monitoring")
                  if host in group_hosts(inventory, g)]
        for addr, port in sorted(found):
            if addr == "127.0.0.11":
                continue  # docker's embedded DNS inside every container (not a lab host's listener)
            candidates = [r for r in rows if r[0] in groups and _port_matches(r[1], port)]
            if not candidates:
                unknown.append((host, addr, port))
                continue
            bind = "loopback" if _loopback(addr) else "fleet"
            if not any(bind in r[2] for r in candidates):
                wrong_bind.append((host, addr, port, [r[2] for r in candidates]))
    assert not unknown, "listeners docs/security.md does not name: %s" % unknown
    assert not wrong_bind, "listeners bound other than docs/security.md says: %s" % wrong_bind
    # Every fixed port the table gives for the lab listens on some host of its group.
    missing = []
    for group, ports, _bind, text in rows:
        if ports == "ephemeral" or "not in the lab" in text:
            continue
        seen = {p for h in group_hosts(inventory, group) for _a, p in listeners.get(h, ())}
        missing.extend((group, p) for p in sorted(ports - seen))
    assert not missing, "ports of docs/security.md's listener table nothing in the lab listens on: %s" % missing

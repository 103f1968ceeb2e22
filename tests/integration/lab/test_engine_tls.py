"""The router-to-engine hop speaks TLS when the fleet asks for it (issue #32 item 3).

The lab runs with kvcache_engine_tls (inventories/lab/group_vars/all/lab_tls.yml): each node's
engine certificate comes from the lab CA (LAB SUBSTITUTE, playbooks/lab_up.yml). Checked here,
from the router host (a caller the firewall admits) and on the nodes:

- every engine port completes a TLS 1.2/1.3 handshake whose certificate verifies against the
  lab CA for the node's address, and a plain-HTTP request to it gets no answer with content;
- the router's workers are the engines' https URLs, and a completion through the router works
  (the router verifies the engines against the CA: vllm-router's client with SSL_CERT_FILE);
- the engine's key is root's (0600) on the node, handed to the engine by systemd
  (LoadCredential), never named in the unit's command line as a file the service user reads.

Every other lab test (validation's stages, the drain, the faults) runs through the same https
engines, so this file only holds what is specific to TLS.

Failed first on the code before kvcache_engine_tls existed: the engines spoke plain HTTP (the
handshake failed) and the router's workers were http URLs.

Wall time: about 10 s (a handshake and a request per engine, one request through the router).
"""
import json

import pytest

from labutil import LAB_CA_FILE, container_name, docker_exec, group_hosts, http, router_workers

# Runs on the router host: handshake (verified for the node's address) and a plain-HTTP try.
PROBE = r"""
import json, socket, ssl, sys
plan = json.load(sys.stdin)
out = {}
for host, port in plan["engines"]:
    key = "%s:%d" % (host, port)
    ctx = ssl.create_default_context(cadata=plan["ca"])
    try:
        with socket.create_connection((host, port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                out[key] = {"verified": True, "version": s.version()}
    except Exception as exc:
        out[key] = {"verified": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    try:
        with socket.create_connection((host, port), timeout=10) as raw:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw.settimeout(10)
            data = b""
            while True:
                chunk = raw.recv(4096)
                if not chunk:
                    break
                data += chunk
        out[key]["plain"] = data.decode("latin-1")[:200]
    except Exception as exc:
        out[key]["plain"] = "error: %s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tls_on(hostvars, node_hosts):
    if not all(str(hostvars[h].get("kvcache_engine_tls", False)).lower() == "true" for h in node_hosts):
        pytest.fail("the lab inventory runs its engines without TLS (kvcache_engine_tls): this test checks the TLS path")
    return True


def test_every_engine_speaks_tls_verified_by_the_lab_ca(tls_on, inventory, hostvars, instances):
    router = group_hosts(inventory, "kvcache_router")[0]
    with open(LAB_CA_FILE, encoding="utf-8") as handle:
        ca = handle.read()
    engines = []
    for _host, _container, _inst, url in instances:
        assert url.startswith("https://"), url
        hostport = url.split("//", 1)[1]
        engines.append([hostport.rsplit(":", 1)[0], int(hostport.rsplit(":", 1)[1])])
    # (docker_exec gives no stdin: the plan goes through printf, the probe as python's -c)
    proc = docker_exec(container_name(hostvars, router), "sh", "-c",
                       "printf '%s' \"$1\" | python3 -c \"$2\"", "sh", json.dumps({"engines": engines, "ca": ca}), PROBE,
                       timeout=120)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for host, port in engines:
        answer = found["%s:%d" % (host, port)]
        assert answer["verified"], answer
        assert answer["version"] in ("TLSv1.2", "TLSv1.3"), answer
        # plain HTTP on the TLS port: no HTTP answer with a body (uvicorn drops it or answers 400)
        assert "200 OK" not in answer["plain"] and '"status"' not in answer["plain"], answer


def test_the_router_reaches_the_engines_over_verified_tls(tls_on, inventory, hostvars, instances, lab_router):
    status, text = router_workers(inventory, hostvars)
    assert status == 200, text
    workers = json.loads(text).get("urls") or []
    assert sorted(workers) == sorted(url for _h, _c, _i, url in instances), workers
    model = hostvars[group_hosts(inventory, "kvcache_nodes")[0]]["kvcache_served_model_name"]
    status, text = http(lab_router.url + "/v1/chat/completions",
                        {"model": model, "messages": [{"role": "user", "content": "hello over tls"}], "max_tokens": 4},
                        key=lab_router.client_key, ca=lab_router.ca_file, timeout=120)
    assert status == 200, text[:500]
    assert '"choices"' in text


def test_the_engine_key_is_roots_and_reaches_the_engine_as_a_credential(tls_on, instances):
    seen = set()
    for _host, container, inst, _url in instances:
        if container in seen:
            continue
        seen.add(container)
        stat = docker_exec(container, "stat", "-c", "%U %G %a", "/etc/kvcache/vllm/tls/engine.key").stdout.split()
        assert stat == ["root", "root", "600"], stat
        unit = "kvcache-vllm@%s.service" % inst["name"]
        # (systemctl show prints LoadCredential as [unprintable]: the unit file says it)
        assert "LoadCredential=engine-tls.key:/etc/kvcache/vllm/tls/engine.key" in \
            docker_exec(container, "systemctl", "cat", unit).stdout.splitlines()
        shown = docker_exec(container, "systemctl", "show", "-p", "ExecStart", unit).stdout
        assert "--ssl-keyfile /run/credentials/%s/engine-tls.key" % unit in shown, shown
        # the running engine's copy, in the unit's own credentials directory
        copy = docker_exec(container, "sh", "-c", "head -c 11 /run/credentials/%s/engine-tls.key" % unit).stdout
        assert copy.startswith("-----BEGIN"), "no credential copy for %s" % unit
        # the service user cannot read the key on disk
        denied = docker_exec(container, "runuser", "-u", "kvcache", "--", "cat", "/etc/kvcache/vllm/tls/engine.key",
                             check=False)
        assert denied.returncode != 0 and "PRIVATE KEY" not in denied.stdout, denied.stdout[:100]

"""Helpers for the tests that run against a lab brought up by `make lab`.

Hosts are reached the way an operator would: `docker exec` into a host's container, or
HTTP to the host's lab address. (A module of its own, not conftest.py: tests/integration
has a conftest.py too, and two modules named conftest must not be imported by name.)
"""
import collections
import json
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")
API_KEY_FILE = os.path.join(ROOT, "build", "lab", "secrets", "api-key")
# LAB SUBSTITUTES made by playbooks/lab_up.yml / the lab inventory (inventories/lab/group_vars/all/lab_tls.yml):
# the CA that signed the router's certificate, and the client key clients send through the router.
LAB_CA_FILE = os.path.join(ROOT, "build", "lab", "tls", "ca.crt")
CLIENT_KEY_FILE = os.path.join(ROOT, "build", "lab", "secrets", "client-api-key")

# How a lab test reaches the router: its TLS front (https), the CA to verify it with, and a
# client key (the engines' key is refused there). The `lab_router` fixture (conftest.py) gives it.
RouterEndpoint = collections.namedtuple("RouterEndpoint", ["url", "ca_file", "client_key"])


def ssl_context(url, ca=None):
    """A verifying TLS context for an https URL (the lab CA unless `ca` names another), else None."""
    if not url.startswith("https:"):
        return None
    return ssl.create_default_context(cafile=ca or LAB_CA_FILE)


def engine_url(hostvars, host, port):
    """Base URL of an engine on a lab node: https when the lab runs its engines with TLS
    (kvcache_engine_tls, verified against the lab CA like the router), else http."""
    scheme = "https" if str(hostvars[host].get("kvcache_engine_tls", False)).lower() in ("true", "1", "yes") else "http"
    return "%s://%s:%d" % (scheme, hostvars[host]["ansible_host"], int(port))


def group_hosts(inventory, group):
    """Hosts of a group of `ansible-inventory --list` output, children included."""
    hosts = list(inventory.get(group, {}).get("hosts", []))
    for child in inventory.get(group, {}).get("children", []):
        hosts.extend(h for h in group_hosts(inventory, child) if h not in hosts)
    return hosts


def container_name(hostvars, host):
    """The lab container of a host (its ansible_docker_host)."""
    return hostvars[host]["ansible_docker_host"]


def docker_exec(container, *argv, timeout=60, check=True):
    return subprocess.run(
        ["docker", "exec", container] + list(argv),
        check=check, capture_output=True, text=True, timeout=timeout,
    )


def http(url, body=None, key=None, timeout=60, ca=None):
    """(status, text) of a GET, or of a JSON POST when body is given. https is verified
    against `ca`, by default the lab CA (LAB_CA_FILE)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context(url, ca)) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metric(url, name, labels):
    """Sum of the samples of a metric on url's /metrics whose labels include `labels`."""
    text = http(url + "/metrics")[1]
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        match = re.match(r"^([^{]+)\{(.*)\}\s+([0-9.eE+-]+)$", line)
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def router_settings_default(name):
    """The router role's default of a router_* variable (written once, in the role)."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)[name]


def router_workers(inventory, hostvars, timeout=30):
    """(status, text) of vllm-router's GET /list_workers, read on the router host itself: the
    worker API listens on its loopback only (router_internal_port), the front refuses it."""
    host = group_hosts(inventory, "kvcache_router")[0]
    port = int(hostvars[host].get("router_internal_port", router_settings_default("router_internal_port")))
    code = ("import urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen('http://127.0.0.1:%d/list_workers', timeout=%d)\n"
            "    print(r.status); print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code); print(e.read().decode())\n") % (port, timeout)
    out = docker_exec(container_name(hostvars, host), "python3", "-c", code, timeout=timeout + 30).stdout
    status, _nl, text = out.partition("\n")
    return int(status), text

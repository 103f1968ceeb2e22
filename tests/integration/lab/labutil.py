"""Helpers for the tests that run against a lab brought up by `make lab`.

Hosts are reached the way an operator would: `docker exec` into a host's container, or
HTTP to the host's lab address. (A module of its own, not conftest.py: tests/integration
has a conftest.py too, and two modules named conftest must not be imported by name.)
"""
import json
import os
import re
import subprocess
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")
API_KEY_FILE = os.path.join(ROOT, "build", "lab", "secrets", "api-key")


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


def http(url, body=None, key=None, timeout=60):
    """(status, text) of a GET, or of a JSON POST when body is given."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
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

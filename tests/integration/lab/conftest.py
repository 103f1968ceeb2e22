"""Fixtures for tests that run against a lab brought up by `make lab`.

They read the lab inventory with ansible-inventory, the same source the playbooks use.
"""
import json
import os
import subprocess

import pytest
import yaml

from labutil import API_KEY_FILE, INVENTORY, ROOT, container_name, group_hosts


@pytest.fixture(scope="session")
def inventory():
    out = subprocess.run(
        ["ansible-inventory", "-i", INVENTORY, "--list"],
        check=True, capture_output=True, text=True, timeout=120, cwd=ROOT,
    ).stdout
    return json.loads(out)


@pytest.fixture(scope="session")
def hostvars(inventory):
    return inventory["_meta"]["hostvars"]


@pytest.fixture(scope="session")
def lab_hosts(inventory):
    return group_hosts(inventory, "kvcache_lab")


@pytest.fixture(scope="session")
def node_hosts(inventory):
    return group_hosts(inventory, "kvcache_nodes")


@pytest.fixture(scope="session")
def api_key():
    with open(API_KEY_FILE, encoding="utf-8") as handle:
        key = handle.read().strip()
    assert len(key) >= 32
    assert os.stat(API_KEY_FILE).st_mode & 0o077 == 0, "the lab's API key file must be root-only"
    return key


@pytest.fixture(scope="session")
def instances(hostvars, node_hosts):
    """(host, container, instance, base_url) for every instance of every node."""
    out = []
    for host in node_hosts:
        for inst in hostvars[host]["vllm_instances"]:
            url = "http://%s:%d" % (hostvars[host]["ansible_host"], inst["port"])
            out.append((host, container_name(hostvars, host), inst, url))
    assert len(out) >= 2, "the lab needs two instances for the cross-instance tests"
    return out


@pytest.fixture(scope="session")
def router_url(inventory, hostvars):
    """Base URL of the lab's router (its lab address and router_port)."""
    routers = group_hosts(inventory, "kvcache_router")
    assert routers, "the lab inventory has no router"
    host = hostvars[routers[0]]
    # The router role's default when the inventory sets none (written once, in the role).
    with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml"), encoding="utf-8") as handle:
        default_port = yaml.safe_load(handle)["router_port"]
    return "http://%s:%d" % (host["ansible_host"], int(host.get("router_port", default_port)))


def pytest_collection_modifyitems(session, config, items):
    """Run the rolling-upgrade test last: it leaves the lab on another model."""
    items.sort(key=lambda item: item.module.__name__ == "test_rolling_upgrade")

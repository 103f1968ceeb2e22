"""Fixtures for tests that run against a lab brought up by `make lab`.

They read the lab inventory with ansible-inventory, the same source the playbooks use.
"""
import json
import os
import subprocess

import pytest
import yaml

from labutil import (API_KEY_FILE, CLIENT_KEY_FILE, INVENTORY, LAB_CA_FILE, ROOT, RouterEndpoint, container_name,
                     engine_url, group_hosts)
from promutil import monitor_container


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
    """The engines' key (kvcache_api_key): for requests to an engine directly."""
    return _secret(API_KEY_FILE)


@pytest.fixture(scope="session")
def instances(hostvars, node_hosts):
    """(host, container, instance, base_url) for every instance of every node."""
    out = []
    for host in node_hosts:
        for inst in hostvars[host]["vllm_instances"]:
            url = engine_url(hostvars, host, inst["port"])
            out.append((host, container_name(hostvars, host), inst, url))
    assert len(out) >= 2, "the lab needs two instances for the cross-instance tests"
    return out


def _secret(path):
    with open(path, encoding="utf-8") as handle:
        key = handle.read().strip()
    assert len(key) >= 32
    assert os.stat(path).st_mode & 0o077 == 0, "the lab's key file %s must be root-only" % path
    return key


@pytest.fixture(scope="session")
def lab_router(inventory, hostvars):
    """labutil.RouterEndpoint of the lab's router: the https URL of its TLS front (lab address and
    router_port), the lab CA that verifies it, and the client key (not the engines' key, which the
    front refuses). The one helper every lab test reaches the router with."""
    routers = group_hosts(inventory, "kvcache_router")
    assert routers, "the lab inventory has no router"
    host = hostvars[routers[0]]
    # The router role's default when the inventory sets none (written once, in the role).
    with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml"), encoding="utf-8") as handle:
        default_port = yaml.safe_load(handle)["router_port"]
    url = "https://%s:%d" % (host["ansible_host"], int(host.get("router_port", default_port)))
    assert os.path.isfile(LAB_CA_FILE), "no lab CA at %s (playbooks/lab_up.yml makes it)" % LAB_CA_FILE
    return RouterEndpoint(url=url, ca_file=LAB_CA_FILE, client_key=_secret(CLIENT_KEY_FILE))


@pytest.fixture(scope="session")
def router_url(lab_router):
    """The https URL of the lab's router (lab_router.url)."""
    return lab_router.url


@pytest.fixture(scope="session")
def client_key(lab_router):
    """The client key the router's front accepts (lab_router.client_key)."""
    return lab_router.client_key


# The modules that read the one site.yml run from the execution environment (eejob.site_run()):
# after the tests that break and restore the lab (faults, mode and tier switches), so that the
# run, which must change nothing, also proves they restored it.
SITE_RUN_READERS = ("test_execution_environment", "test_runner", "test_secrets")


def pytest_collection_modifyitems(session, config, items):
    """The readers of the shared site.yml run after the tests that break and restore the lab, and
    the rolling-upgrade test last: it leaves the lab on another model."""
    def rank(item):
        name = item.module.__name__
        return 2 if name == "test_rolling_upgrade" else 1 if name in SITE_RUN_READERS else 0
    items.sort(key=rank)


@pytest.fixture(scope="session")
def monitor(inventory, hostvars):
    """The container of the lab's monitoring host, whose Prometheus promutil.prom() asks."""
    return monitor_container(inventory, hostvars)

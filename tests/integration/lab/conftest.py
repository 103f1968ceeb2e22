"""Fixtures for tests that run against a lab brought up by `make lab`.

They read the lab inventory with ansible-inventory (the same source the playbooks use)
and reach hosts the way an operator would: `docker exec` into the container, or HTTP
to the host's lab address.
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")


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


def group_hosts(inventory, group):
    """Hosts of a group, children included."""
    hosts = list(inventory.get(group, {}).get("hosts", []))
    for child in inventory.get(group, {}).get("children", []):
        hosts.extend(h for h in group_hosts(inventory, child) if h not in hosts)
    return hosts


@pytest.fixture(scope="session")
def lab_hosts(inventory):
    return group_hosts(inventory, "kvcache_lab")


@pytest.fixture(scope="session")
def node_hosts(inventory):
    return group_hosts(inventory, "kvcache_nodes")


def container_name(hostvars, host):
    """The lab container of a host: ansible_docker_host, templated as Ansible would."""
    return hostvars[host]["ansible_docker_host"].replace("{{ inventory_hostname }}", host)


def docker_exec(container, *argv, timeout=60, check=True):
    return subprocess.run(
        ["docker", "exec", container] + list(argv),
        check=check, capture_output=True, text=True, timeout=timeout,
    )

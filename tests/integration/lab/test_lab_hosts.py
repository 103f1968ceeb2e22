"""The lab's hosts are what the inventory says: systemd containers on the lab network."""
import json
import subprocess

from labutil import container_name, docker_exec


def test_every_lab_host_runs_systemd(hostvars, lab_hosts):
    assert lab_hosts, "the lab inventory has no hosts in kvcache_lab"
    for host in lab_hosts:
        name = container_name(hostvars, host)
        pid1 = docker_exec(name, "cat", "/proc/1/comm").stdout.strip()
        assert pid1 == "systemd", "%s: PID 1 is %r" % (host, pid1)
        state = docker_exec(name, "systemctl", "is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded"), "%s: systemd is %r" % (host, state)


def test_lab_hosts_have_their_inventory_address_and_name(hostvars, lab_hosts):
    for host in lab_hosts:
        name = container_name(hostvars, host)
        info = json.loads(subprocess.run(
            ["docker", "inspect", name], check=True, capture_output=True, text=True, timeout=30,
        ).stdout)[0]
        addresses = [n["IPAddress"] for n in info["NetworkSettings"]["Networks"].values()]
        assert hostvars[host]["ansible_host"] in addresses
        assert docker_exec(name, "hostname").stdout.strip() == host


def test_lab_hosts_reach_each_other(hostvars, lab_hosts):
    first = container_name(hostvars, lab_hosts[0])
    for host in lab_hosts[1:]:
        result = docker_exec(first, "ping", "-c", "1", "-W", "2", hostvars[host]["ansible_host"], check=False)
        assert result.returncode == 0, "%s cannot reach %s: %s" % (lab_hosts[0], host, result.stdout + result.stderr)

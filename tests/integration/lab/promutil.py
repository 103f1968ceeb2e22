"""The lab's Prometheus (on lab-monitor, API on its loopback), asked with `docker exec`: the helpers
test_monitoring.py and test_switches.py share."""
import json
import time

import pytest

from labutil import container_name, docker_exec, group_hosts

# Runs inside lab-monitor: GET one Prometheus API path, print the JSON.
_PROM_GET = ("import sys, urllib.request, urllib.parse\n"
             "url = 'http://127.0.0.1:9090' + sys.argv[1]\n"
             "if len(sys.argv) > 2: url += '?' + urllib.parse.urlencode({'query': sys.argv[2]})\n"
             "print(urllib.request.urlopen(url, timeout=20).read().decode())\n")


def monitor_container(inventory, hostvars):
    """The container of the lab's own monitoring host (lab-monitor), whose Prometheus the tests ask."""
    hosts = [h for h in group_hosts(inventory, "kvcache_monitoring") if h != "localhost"]
    assert hosts, "the lab inventory has no monitoring host of its own (lab-monitor)"
    return container_name(hostvars, hosts[0])


def prom(monitor, path, query=None):
    argv = ["python3", "-c", _PROM_GET, path] + ([query] if query else [])
    body = json.loads(docker_exec(monitor, *argv, timeout=60).stdout)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what, probe, timeout, every=3):
    """Poll probe() until it returns something true; return it, or fail naming what and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    pytest.fail("%s within %d s; last: %r" % (what, timeout, last))


def alerts(monitor, name, state="firing", **labels):
    return [a for a in prom(monitor, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and a["state"] == state
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def targets(monitor):
    return [t for t in prom(monitor, "/api/v1/targets")["activeTargets"] if t["labels"].get("kvcache_component")]

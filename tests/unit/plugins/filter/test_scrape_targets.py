# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests for the scrape_targets filter (kvcache.offload)."""

from __future__ import absolute_import, division, print_function

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter.scrape_targets import FilterModule, scrape_targets

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

DEFAULTS = {
    "kvcache_lmcache_mode": "inprocess",
    "lmcache_mp_http_host": "127.0.0.1",
    "lmcache_mp_http_port": 8080,
    "router_implementation": "production_stack",
    "router_port": 8001,
    "router_metrics_port": 29000,
}

HOSTVARS = {
    "gpu1": {
        "ansible_host": "10.0.0.11",
        "vllm_instances": [{"name": "gpu1-0", "port": 8000, "gpus": [0]}, {"name": "gpu1-1", "port": "8001"}],
        "kvcache_lmcache_mode": "multiprocess",
        "lmcache_mp_http_host": "10.1.0.11",  # an internal interface
    },
    "gpu2": {
        "ansible_host": "10.0.0.12",
        "vllm_instances": [{"port": 8000}],
        "kvcache_lmcache_mode": "multiprocess",
        "lmcache_mp_http_host": "0.0.0.0",
        "lmcache_mp_http_port": "9090",
    },
    "gpu3": {  # default bind: loopback
        "ansible_host": "fd00::13",
        "vllm_instances": [{"name": "gpu3-0", "port": 8000}],
        "kvcache_lmcache_mode": "multiprocess",
    },
    "gpu4": {"vllm_instances": []},  # in-process mode (default), no instances
    "router": {"ansible_host": "10.0.0.10"},
    "router2": {"ansible_host": "10.0.0.20", "router_implementation": "vllm_router", "router_metrics_host": "0.0.0.0"},
}


def labels(component, node, instance, **extra):
    out = {"kvcache_component": component, "kvcache_node": node, "kvcache_instance": instance}
    out.update(extra)
    return out


def test_vllm_every_instance_in_inventory_order():
    got = scrape_targets(HOSTVARS, ["gpu1", "gpu2", "gpu3", "gpu4"], "vllm", DEFAULTS)
    assert got == [
        {"targets": ["10.0.0.11:8000"], "labels": labels("vllm", "gpu1", "gpu1-0")},
        {"targets": ["10.0.0.11:8001"], "labels": labels("vllm", "gpu1", "gpu1-1")},
        {"targets": ["10.0.0.12:8000"], "labels": labels("vllm", "gpu2", "gpu2-0")},  # unnamed: <host>-<index>
        {"targets": ["[fd00::13]:8000"], "labels": labels("vllm", "gpu3", "gpu3-0")},  # IPv6 in brackets
    ]


def test_vllm_without_ansible_host_uses_the_inventory_name():
    got = scrape_targets({"n1": {"vllm_instances": [{"name": "a", "port": 8000}]}}, ["n1"], "vllm")
    assert got[0]["targets"] == ["n1:8000"]


def test_lmcache_mp_internal_wildcard_and_loopback_binds():
    hosts = ["gpu1", "gpu2", "gpu3", "gpu4"]
    hostvars = {host: dict(values, kvcache_metrics_proxy=False) for host, values in HOSTVARS.items()}
    got = scrape_targets(hostvars, hosts, "lmcache_mp", DEFAULTS)
    assert got == [
        {"targets": ["10.1.0.11:8080"], "labels": labels("lmcache_mp", "gpu1", "gpu1-lmcache")},
        {"targets": ["10.0.0.12:9090"], "labels": labels("lmcache_mp", "gpu2", "gpu2-lmcache")},
    ]  # gpu3 binds to loopback (skipped by default), gpu4 runs LMCache in-process
    kept = scrape_targets(hostvars, hosts, "lmcache_mp", DEFAULTS, loopback="keep")
    assert kept[-1] == {"targets": ["127.0.0.1:8080"], "labels": labels("lmcache_mp", "gpu3", "gpu3-lmcache")}
    with pytest.raises(AnsibleFilterError, match=r"host gpu3: .*bound to 127.0.0.1.*Fix: set lmcache_mp_http_host"):
        scrape_targets(hostvars, hosts, "lmcache_mp", DEFAULTS, loopback="fail")


PROXY = {"__metrics_path__": "/proxy"}


def test_a_loopback_server_is_scraped_through_the_nodes_metrics_proxy():
    """Issue #37 item 1: with the metrics proxy (roles/kvcache's default), a loopback-bound server is a
    target on the node's proxy with module=lmcache, whatever `loopback` says; a server bound to an
    address is scraped there directly."""
    hosts = ["gpu1", "gpu2", "gpu3", "gpu4"]
    for loopback in ("skip", "keep", "fail"):
        got = scrape_targets(HOSTVARS, hosts, "lmcache_mp", DEFAULTS, loopback=loopback)
        assert got[2] == {"targets": ["[fd00::13]:9999"],
                          "labels": labels("lmcache_mp", "gpu3", "gpu3-lmcache", __param_module="lmcache", **PROXY)}
        assert [g["targets"] for g in got[:2]] == [["10.1.0.11:8080"], ["10.0.0.12:9090"]] and len(got) == 3
    hv = {"n1": {"ansible_host": "n1.example", "kvcache_metrics_proxy_address": "10.2.0.1",
                 "kvcache_metrics_proxy_port": "9998", "kvcache_lmcache_mode": "multiprocess"}}
    assert scrape_targets(hv, ["n1"], "lmcache_mp", DEFAULTS)[0]["targets"] == ["10.2.0.1:9998"]
    with pytest.raises(AnsibleFilterError, match="host n1: kvcache_metrics_proxy_port is 'x'. Fix"):
        scrape_targets({"n1": dict(hv["n1"], kvcache_metrics_proxy_port="x")}, ["n1"], "lmcache_mp", DEFAULTS)


def test_the_pruner_is_scraped_on_the_node_that_prunes():
    """The pruner's metrics (kvcache_prune's metrics file) through the proxy, module=kvcache_prune, on the
    node kvcache_prune's rule picks: the first of kvcache_prune_fleet_group, every node with scope all;
    none on the s3 tier or without the proxy."""
    groups = {"kvcache_nodes": ["n1", "n2"], "gpu_a": ["n2"]}
    hv = {name: {"ansible_host": address, "groups": groups} for name, address in (("n1", "10.0.0.1"), ("n2", "10.0.0.2"))}
    got = scrape_targets(hv, ["n1", "n2"], "prune")
    assert got == [{"targets": ["10.0.0.1:9999"],
                    "labels": labels("prune", "n1", "n1-prune", __param_module="kvcache_prune", **PROXY)}]
    every = {h: dict(v, kvcache_prune_scope="all") for h, v in hv.items()}
    assert [g["targets"] for g in scrape_targets(every, ["n1", "n2"], "prune")] == [["10.0.0.1:9999"], ["10.0.0.2:9999"]]
    other = {h: dict(v, kvcache_prune_fleet_group="gpu_a") for h, v in hv.items()}
    assert [g["labels"]["kvcache_node"] for g in scrape_targets(other, ["n1", "n2"], "prune")] == ["n2"]
    s3 = {h: dict(v, kvcache_tier="s3") for h, v in hv.items()}
    assert scrape_targets(s3, ["n1", "n2"], "prune") == []
    off = {h: dict(v, kvcache_metrics_proxy=False) for h, v in hv.items()}
    assert scrape_targets(off, ["n1", "n2"], "prune") == []
    no_file = {h: dict(v, kvcache_prune_metrics_file="") for h, v in hv.items()}
    assert scrape_targets(no_file, ["n1", "n2"], "prune") == []


def test_lmcache_mode_per_host_overrides_the_fleet_value():
    hv = {"n1": {"ansible_host": "10.0.0.1", "lmcache_mode": "multiprocess", "lmcache_mp_http_host": "0.0.0.0"}}
    assert scrape_targets(hv, ["n1"], "lmcache_mp", DEFAULTS)[0]["targets"] == ["10.0.0.1:8080"]
    assert scrape_targets(hv, ["n1"], "lmcache_mp", dict(DEFAULTS, kvcache_lmcache_mode="multiprocess"))
    assert scrape_targets({"n1": {}}, ["n1"], "lmcache_mp", DEFAULTS) == []


def test_router_metrics_are_on_the_fronts_metrics_port_for_both_implementations():
    # the client port (router_port) is the TLS front, which refuses /metrics
    got = scrape_targets(HOSTVARS, ["router", "router2"], "router", DEFAULTS)
    assert got == [
        {"targets": ["10.0.0.10:29000"],
         "labels": labels("router", "router", "router", kvcache_router_implementation="production_stack")},
        {"targets": ["10.0.0.20:29000"],
         "labels": labels("router", "router2", "router2", kvcache_router_implementation="vllm_router")},
    ]
    hv = {"r": {"ansible_host": "10.0.0.5", "router_implementation": "vllm_router",
                "router_metrics_host": "10.9.0.5", "router_metrics_port": 29100}}
    assert scrape_targets(hv, ["r"], "router", DEFAULTS)[0]["targets"] == ["10.9.0.5:29100"]


def test_dcgm_exporter_of_every_node_at_the_fleet_port():
    """Issue #37 item 4: NVIDIA's DCGM exporter on each node (roles/kvcache: on, port 9450), at the
    address it binds to (nvidia_driver_dcgm_exporter_address, else ansible_host); none when off."""
    hv = {"gpu1": {"ansible_host": "10.0.0.11"},
          "gpu2": {"ansible_host": "10.0.0.12", "nvidia_driver_dcgm_exporter_address": "10.1.0.12",
                   "kvcache_dcgm_exporter_port": "9460"},
          "gpu3": {"ansible_host": "fd00::13"},
          "cpu1": {"ansible_host": "10.0.0.14", "kvcache_dcgm_exporter": False}}
    assert scrape_targets(hv, ["gpu1", "gpu2", "gpu3", "cpu1"], "dcgm") == [
        {"targets": ["10.0.0.11:9450"], "labels": labels("dcgm", "gpu1", "gpu1-gpus")},
        {"targets": ["10.1.0.12:9460"], "labels": labels("dcgm", "gpu2", "gpu2-gpus")},
        {"targets": ["[fd00::13]:9450"], "labels": labels("dcgm", "gpu3", "gpu3-gpus")},
    ]
    with pytest.raises(AnsibleFilterError, match="kvcache_dcgm_exporter is 'maybe', not a boolean"):
        scrape_targets({"g": {"kvcache_dcgm_exporter": "maybe"}}, ["g"], "dcgm")


def test_empty_or_missing_groups_give_no_targets():
    assert scrape_targets(HOSTVARS, [], "vllm") == []
    assert scrape_targets(HOSTVARS, None, "router") == []


@pytest.mark.parametrize("hostvars, match", [
    ({"h": {"vllm_instances": {"name": "a", "port": 1}}}, r"host h: vllm_instances must be a list"),
    ({"h": {"vllm_instances": ["a"]}}, r"host h: vllm_instances\[0\] is not a mapping"),
    ({"h": {"vllm_instances": [{"name": "a"}]}}, r"host h: vllm_instances\[0\].port is None"),
    ({"h": {"vllm_instances": [{"name": "a", "port": 70000}]}}, r"Fix: set vllm_instances"),
    ({"h": {"vllm_instances": [{"name": "a", "port": True}]}}, r"port is True"),
    ({"h": {"vllm_instances": [{"name": "a", "port": 8000}, {"name": "b", "port": 8000}]}},
     r"host h: vllm target h:8000 is also h/a"),
])
def test_bad_instances_name_the_host(hostvars, match):
    with pytest.raises(AnsibleFilterError, match=match):
        scrape_targets(hostvars, ["h"], "vllm")


def test_bad_arguments():
    with pytest.raises(AnsibleFilterError, match="component must be one of"):
        scrape_targets(HOSTVARS, ["gpu1"], "grafana")
    with pytest.raises(AnsibleFilterError, match="loopback must be one of"):
        scrape_targets(HOSTVARS, ["gpu1"], "lmcache_mp", loopback="maybe")
    with pytest.raises(AnsibleFilterError, match="hosts must be a list"):
        scrape_targets(HOSTVARS, "gpu1", "vllm")
    with pytest.raises(AnsibleFilterError, match="host nope is not in hostvars"):
        scrape_targets(HOSTVARS, ["nope"], "vllm")
    with pytest.raises(AnsibleFilterError, match="host r: router_metrics_port is 'x'"):
        scrape_targets({"r": {"router_metrics_port": "x"}}, ["r"], "router")


def test_registered_as_a_filter():
    assert FilterModule().filters()["scrape_targets"] is scrape_targets


def test_observability_defaults_mirror_the_roles_that_own_the_ports():
    """The role's fallbacks for hosts that do not define them equal the owning roles' defaults."""
    def load(role):
        with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
            return yaml.safe_load(handle)
    obs = load("observability")["observability_target_defaults"]
    router, lmc, fleet = load("router"), load("lmcache"), load("kvcache")
    assert obs["router_port"] == router["router_port"]
    assert obs["router_metrics_port"] == router["router_metrics_port"]
    assert obs["router_implementation"] == router["router_implementation"]
    assert obs["lmcache_mp_http_port"] == lmc["lmcache_mp_http_port"]
    assert obs["lmcache_mp_http_host"] == lmc["lmcache_mp_http_host"]
    # roles/kvcache derives its mode (multiprocess, in-process for the GDS tier): the fallback is
    # the value without GDS, and the filter derives the GDS case itself (next test).
    assert obs["kvcache_lmcache_mode"] == "multiprocess"
    assert fleet["kvcache_lmcache_mode"] == "{{ 'inprocess' if kvcache_fs_gds | bool else 'multiprocess' }}"


def test_lmcache_mode_of_a_host_that_sets_none_is_derived_like_roles_kvcache():
    """Issue #21 item 3: with the multiprocess default, a node on the GDS tier (in-process,
    derived) has no LMCache server to scrape; a node that sets nothing has one."""
    fallback = dict(DEFAULTS, kvcache_lmcache_mode="multiprocess")
    hv = {"plain": {"ansible_host": "10.0.0.1"},
          "gds": {"ansible_host": "10.0.0.2", "kvcache_fs_gds": True},
          "gds-mp": {"ansible_host": "10.0.0.3", "kvcache_fs_gds": True, "kvcache_lmcache_mode": "multiprocess"}}
    got = scrape_targets(hv, ["plain", "gds", "gds-mp"], "lmcache_mp", fallback, loopback="keep")
    assert [g["labels"]["kvcache_node"] for g in got] == ["plain", "gds-mp"]


def test_vllm_targets_of_derived_instances():
    """Issue #18: derived instances (no vllm_instances) are scraped, one target each."""
    hostvars = {
        "gpu-a01": {"ansible_host": "10.20.0.11", "ansible_facts": {"gpu_facts": {"count": 8}}},
        "gpu-a02": {"ansible_host": "10.20.0.12", "vllm_instances": [], "ansible_facts": {"gpu_facts": {"count": 2}}},
        "gpu-a03": {"ansible_host": "10.20.0.13",
                    "vllm_effective_instances": [{"name": "gpu0", "port": 8000, "gpus": [0, 1]}]},
    }
    got = scrape_targets(hostvars, ["gpu-a01", "gpu-a02", "gpu-a03"], "vllm",
                         defaults={"kvcache_tensor_parallel_size": 2})
    assert [(g["labels"]["kvcache_node"], g["labels"]["kvcache_instance"], g["targets"][0]) for g in got] == [
        ("gpu-a01", "gpu0", "10.20.0.11:8000"), ("gpu-a01", "gpu2", "10.20.0.11:8001"),
        ("gpu-a01", "gpu4", "10.20.0.11:8002"), ("gpu-a01", "gpu6", "10.20.0.11:8003"),
        ("gpu-a02", "gpu0", "10.20.0.12:8000"), ("gpu-a03", "gpu0", "10.20.0.13:8000")]

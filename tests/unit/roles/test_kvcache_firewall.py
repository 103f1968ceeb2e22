# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/kvcache_firewall: the rules a host gets from a small inventory, and the ruleset it renders.

- plugins/filter/firewall_plan.py (what the role, preflight and the docs' table read): every
  engine port of a node from the router, the monitoring hosts and the controller; the router's
  client port from anywhere and its metrics port from the monitoring hosts; the lab S3 store's
  port from the nodes and the controller; a name in ansible_host resolved from the gathered
  default route; bad sources and ports refused naming host, variable and fix.
- templates/kvcache.nft.j2, rendered by ansible-playbook through the role's own plan tasks from
  an inventory in a temporary directory: one table of ours replaced atomically (no flush
  ruleset), the engines' port admitted from the fleet sets only, everything else dropped, and
  (where nft and CAP_NET_ADMIN are at hand, as on the development machine and CI) `nft -c`
  accepts the file.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter.firewall_plan import firewall_plan

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLE = os.path.join(ROOT, "roles", "kvcache_firewall")
COLLECTIONS = os.path.join(ROOT, "build", "collections")

SETTINGS = {"ssh_ports": [22], "ssh_sources": [], "client_sources": [], "controller_sources": ["172.29.100.1"],
            "engine_sources": [], "allow": []}
GROUPS = {"kvcache_nodes": ["node1", "node2"], "kvcache_router": ["router"], "kvcache_monitoring": ["localhost"],
          "kvcache_s3_store": ["s3"], "kvcache_storage_controllers": ["localhost"]}


def hostvars(**changes):
    hosts = {
        "localhost": {"ansible_connection": "local"},
        "node1": {"ansible_host": "172.29.100.11",
                  "vllm_instances": [{"name": "a", "port": 8000}, {"name": "b", "port": 8001}]},
        "node2": {"ansible_host": "172.29.100.12", "vllm_instances": [{"name": "a", "port": 8000}]},
        "router": {"ansible_host": "172.29.100.20", "router_implementation": "vllm_router"},
        "s3": {"ansible_host": "172.29.100.30", "kvcache_s3_endpoint": "http://s3.lab.internal:8333"},
    }
    for host, values in changes.items():
        hosts.setdefault(host, {}).update(values)
    return hosts


def rules(plan):
    return {rule["name"]: rule for rule in plan["rules"]}


def test_a_node_admits_its_engines_from_router_monitoring_and_controller_only():
    plan = firewall_plan(hostvars(), "node1", GROUPS, SETTINGS)
    got = rules(plan)
    assert sorted(got) == ["dcgm_exporter", "engines", "metrics_proxy", "ssh"]
    assert got["engines"]["ports"] == ["8000", "8001"]
    # the node-local metrics proxy: the monitoring hosts (localhost: the controller) and the controller only
    assert got["metrics_proxy"]["ports"] == ["9999"] and got["metrics_proxy"]["v4"] == ["172.29.100.1"]
    assert got["engines"]["any"] is False
    assert got["engines"]["v4"] == ["172.29.100.1", "172.29.100.20"]
    assert "lab" not in got["engines"]["from"] and "router hosts (router)" in got["engines"]["from"]
    assert got["ssh"] == dict(got["ssh"], ports=["22"], any=True)
    # no node and no S3 store is an engine's caller
    assert "172.29.100.12" not in got["engines"]["v4"] and "172.29.100.30" not in got["engines"]["v4"]
    assert plan["unresolved"] == [] and plan["instances_unknown"] is False


def test_a_router_admits_clients_from_anywhere_and_metrics_from_monitoring():
    got = rules(firewall_plan(hostvars(), "router", GROUPS, SETTINGS))
    assert sorted(got) == ["router_client", "router_metrics", "ssh"]
    assert got["router_client"]["ports"] == ["8001"] and got["router_client"]["any"] is True
    assert got["router_metrics"]["ports"] == ["29000"] and got["router_metrics"]["v4"] == ["172.29.100.1"]


def test_router_settings_and_metrics_on_loopback():
    got = rules(firewall_plan(hostvars(router={"router_port": 443, "router_metrics_host": "127.0.0.1"}),
                              "router", GROUPS, dict(SETTINGS, client_sources=["10.9.0.0/16"])))
    assert sorted(got) == ["router_client", "ssh"]
    assert got["router_client"]["ports"] == ["443"] and got["router_client"]["v4"] == ["10.9.0.0/16"]


def test_the_s3_store_admits_nodes_and_controller():
    got = rules(firewall_plan(hostvars(), "s3", GROUPS, SETTINGS))
    assert got["s3"]["ports"] == ["8333"]
    assert got["s3"]["v4"] == ["172.29.100.1", "172.29.100.11", "172.29.100.12"]


def test_names_resolve_from_facts_and_ipv6_goes_to_its_own_set():
    hv = hostvars(router={"ansible_host": "router.example.com",
                          "ansible_facts": {"default_ipv4": {"address": "10.20.0.5"}}},
                  mon={"ansible_host": "2001:db8::9"})
    groups = dict(GROUPS, kvcache_monitoring=["mon"])
    got = rules(firewall_plan(hv, "node2", groups, SETTINGS))
    assert got["engines"]["v4"] == ["10.20.0.5", "172.29.100.1"]
    assert got["engines"]["v6"] == ["2001:db8::9"]
    assert firewall_plan(hv, "node2", groups, SETTINGS)["firewalld"]["rich_rules"] == sorted([
        'rule family="ipv4" source address="10.20.0.5" port port="8000" protocol="tcp" accept',
        'rule family="ipv4" source address="172.29.100.1" port port="8000" protocol="tcp" accept',
        'rule family="ipv6" source address="2001:db8::9" port port="8000" protocol="tcp" accept',
        # NVIDIA's DCGM exporter: the monitoring host and the controller only (not the router)
        'rule family="ipv4" source address="172.29.100.1" port port="9450" protocol="tcp" accept',
        'rule family="ipv6" source address="2001:db8::9" port port="9450" protocol="tcp" accept',
        # the node-local metrics proxy: the same two
        'rule family="ipv4" source address="172.29.100.1" port port="9999" protocol="tcp" accept',
        'rule family="ipv6" source address="2001:db8::9" port port="9999" protocol="tcp" accept'])


def test_a_name_without_facts_is_unresolved_not_forgotten():
    plan = firewall_plan(hostvars(router={"ansible_host": "router.example.com"}), "node1", GROUPS, SETTINGS)
    assert plan["unresolved"] == ["router"]


def test_instances_derived_from_gpus_or_unknown():
    hv = hostvars(node1={"vllm_instances": [], "ansible_facts": {"gpu_facts": {"count": 4}},
                         "kvcache_tensor_parallel_size": 2, "vllm_base_port": 9000})
    assert rules(firewall_plan(hv, "node1", GROUPS, SETTINGS))["engines"]["ports"] == ["9000", "9001"]
    hv = hostvars(node1={"vllm_instances": []})
    plan = firewall_plan(hv, "node1", GROUPS, SETTINGS)
    assert plan["instances_unknown"] is True and "engines" not in rules(plan)


def test_kvaware_opens_the_controller_and_worker_ports():
    hv = hostvars(router={"router_implementation": "production_stack", "router_routing_logic": "kvaware"},
                  node1={"kvcache_lmcache_mode": "inprocess"})
    node = rules(firewall_plan(hv, "node1", GROUPS, SETTINGS))
    assert node["lmcache_workers"]["ports"] == ["9400-9401"] and node["lmcache_workers"]["v4"] == ["172.29.100.20"]
    router = rules(firewall_plan(hv, "router", GROUPS, SETTINGS))
    assert router["lmcache_controller"]["ports"] == ["9000", "9001"]
    assert router["lmcache_controller"]["v4"] == ["172.29.100.11", "172.29.100.12"]


def test_kvaware_worker_ports_follow_each_nodes_own_lmcache_mode():
    """The node's mode as roles/kvcache derives it: the GDS tier is in-process (its workers listen for the
    controller); a node that sets no mode and no GDS runs LMCache's multiprocess server, which has no workers."""
    router = {"router_implementation": "production_stack", "router_routing_logic": "kvaware"}
    gds = rules(firewall_plan(hostvars(router=router, node1={"kvcache_fs_gds": True}), "node1", GROUPS, SETTINGS))
    assert gds["lmcache_workers"]["ports"] == ["9400-9401"]
    unset = rules(firewall_plan(hostvars(router=router), "node1", GROUPS, SETTINGS))
    assert "lmcache_workers" not in unset and "engines" in unset


def test_the_dcgm_exporter_is_let_in_from_monitoring_and_controller_only():
    """Issue #37 item 4: the GPU metrics port (kvcache_dcgm_exporter_port, roles/kvcache's 9450) on
    every node, from the monitoring hosts and the controller; not from the router. Off with
    kvcache_dcgm_exporter: false, moved with the port."""
    hv = hostvars(mon={"ansible_host": "172.29.100.40"})
    groups = dict(GROUPS, kvcache_monitoring=["mon"])
    got = rules(firewall_plan(hv, "node1", groups, SETTINGS))["dcgm_exporter"]
    assert got["ports"] == ["9450"] and got["v4"] == ["172.29.100.1", "172.29.100.40"] and got["any"] is False
    assert "monitoring hosts (mon)" in got["from"]
    assert "dcgm_exporter" not in rules(firewall_plan(hv, "router", groups, SETTINGS))
    off = hostvars(node1={"kvcache_dcgm_exporter": False})
    assert "dcgm_exporter" not in rules(firewall_plan(off, "node1", GROUPS, SETTINGS))
    moved = hostvars(node1={"kvcache_dcgm_exporter_port": "9460"})
    assert rules(firewall_plan(moved, "node1", GROUPS, SETTINGS))["dcgm_exporter"]["ports"] == ["9460"]
    with pytest.raises(AnsibleFilterError, match="kvcache_dcgm_exporter_port is 'x'. Fix"):
        firewall_plan(hostvars(node1={"kvcache_dcgm_exporter_port": "x"}), "node1", GROUPS, SETTINGS)


def test_the_metrics_proxy_is_let_in_from_monitoring_and_controller_only():
    """Issue #37 item 1: the node-local metrics proxy (kvcache_metrics_proxy_port, roles/kvcache's 9999) on
    every node, from the monitoring hosts and the controller; not from the router, not from anywhere. Off
    with kvcache_metrics_proxy: false, moved with the port."""
    hv = hostvars(mon={"ansible_host": "172.29.100.40"})
    groups = dict(GROUPS, kvcache_monitoring=["mon"])
    got = rules(firewall_plan(hv, "node2", groups, SETTINGS))["metrics_proxy"]
    assert got["ports"] == ["9999"] and got["v4"] == ["172.29.100.1", "172.29.100.40"] and got["any"] is False
    assert "monitoring hosts (mon)" in got["from"]
    assert "metrics_proxy" not in rules(firewall_plan(hv, "router", groups, SETTINGS))
    off = hostvars(node1={"kvcache_metrics_proxy": False})
    assert "metrics_proxy" not in rules(firewall_plan(off, "node1", GROUPS, SETTINGS))
    moved = hostvars(node1={"kvcache_metrics_proxy_port": 9998})
    assert rules(firewall_plan(moved, "node1", GROUPS, SETTINGS))["metrics_proxy"]["ports"] == ["9998"]
    with pytest.raises(AnsibleFilterError, match="kvcache_metrics_proxy_port is 0. Fix"):
        firewall_plan(hostvars(node1={"kvcache_metrics_proxy_port": 0}), "node1", GROUPS, SETTINGS)


def test_extra_rules():
    settings = dict(SETTINGS, allow=[{"port": 9100, "sources": ["10.1.0.0/24", "2001:db8::/64"], "comment": "exporter"},
                                     {"port": "60000-60010", "proto": "udp"}],
                    ssh_sources=["10.0.0.0/8"], engine_sources=["10.3.0.7"])
    got = rules(firewall_plan(hostvars(), "node1", GROUPS, settings))
    assert got["allow_0"]["v4"] == ["10.1.0.0/24"] and got["allow_0"]["v6"] == ["2001:db8::/64"]
    assert got["allow_1"] == dict(got["allow_1"], proto="udp", ports=["60000-60010"], any=True)
    assert got["ssh"]["v4"] == ["10.0.0.0/8"] and got["ssh"]["any"] is False
    assert "10.3.0.7" in got["engines"]["v4"]


@pytest.mark.parametrize("settings, words", [
    (dict(SETTINGS, controller_sources=["ctl.example.com"]),
     ["host node1", "kvcache_firewall_controller_sources[0]", "not an IP address", "Fix:"]),
    (dict(SETTINGS, ssh_sources=["10.0.0.5/24"]),
     ["host node1", "kvcache_firewall_ssh_sources[0]", "host bits set", "10.0.0.0/24"]),
    (dict(SETTINGS, ssh_ports=[70000]), ["host node1", "kvcache_firewall_ssh_ports[0]", "1 to 65535"]),
    (dict(SETTINGS, allow=[{"port": 0}]), ["kvcache_firewall_allow[0].port", "Fix:"]),
    (dict(SETTINGS, allow=[{"port": 53, "proto": "sctp"}]), ["kvcache_firewall_allow[0].proto", "tcp or udp"]),
    (dict(SETTINGS, allow=[{"port": 53, "sources": ["any"]}]), ["kvcache_firewall_allow[0].sources[0]"]),
    (dict(SETTINGS, engine_sources="10.0.0.1"), ["kvcache_firewall_engine_sources must be a list"]),
])
def test_bad_input_names_host_variable_and_fix(settings, words):
    with pytest.raises(AnsibleFilterError) as error:
        firewall_plan(hostvars(), "node1", GROUPS, settings)
    for word in words:
        assert word in str(error.value)


def test_a_bad_instance_port_names_the_instance():
    with pytest.raises(AnsibleFilterError, match=r"vllm_instances\[0\]\.port"):
        firewall_plan(hostvars(node1={"vllm_instances": [{"name": "a", "port": 99999}]}), "node1", GROUPS, SETTINGS)


# --- the rendered ruleset, through the role's own tasks ---

PLAYBOOK = """
- hosts: node1:router
  gather_facts: false
  connection: local
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: The role's plan
      ansible.builtin.include_role:
        name: kvcache.offload.kvcache_firewall
        tasks_from: plan
        public: true
    - name: Load the OS settings of the role
      ansible.builtin.include_vars: "%(role)s/vars/Debian.yml"
    - name: The role's ruleset, as tasks/nftables.yml renders it
      ansible.builtin.set_fact:
        __kvcache_firewall_nft_body: "{{ lookup('ansible.builtin.template', '%(role)s/templates/kvcache.nft.j2') }}"
    - name: Write it
      ansible.builtin.copy:
        content: "{{ __kvcache_firewall_nft_body | replace('@@FINGERPRINT@@', __kvcache_firewall_fingerprint) }}"
        dest: "%(out)s/{{ inventory_hostname }}.nft"
        mode: "0644"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("firewall")
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local"}},
                         "vars": {"kvcache_firewall_controller_sources": ["172.29.100.1"],
                                  "kvcache_firewall_controller_detect": False},
                         "children": {
                             "kvcache_nodes": {"hosts": {"node1": {"ansible_host": "172.29.100.11",
                                                                   "vllm_instances": [{"name": "a", "port": 8000},
                                                                                      {"name": "b", "port": 8001}]}}},
                             "kvcache_router": {"hosts": {"router": {"ansible_host": "172.29.100.20",
                                                                     "router_implementation": "vllm_router"}}},
                             "kvcache_monitoring": {"hosts": {"localhost": {}, "prom": {"ansible_host": "fd00::9"}}}}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(PLAYBOOK % {"role": ROLE, "out": str(tmp)})
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_HOME=str(tmp / "home"),
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {host: (tmp / ("%s.nft" % host)).read_text() for host in ("node1", "router")}


def test_the_ruleset_replaces_our_table_alone(rendered):
    text = rendered["node1"]
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[:3] == ["table inet kvcache", "delete table inet kvcache", "table inet kvcache {"]
    assert not re.search(r"^\s*flush ", text, re.M)


def test_the_node_ruleset_admits_the_engines_from_the_fleet_sets_only(rendered):
    text = rendered["node1"]
    assert re.search(r"set engines_v4 \{[^}]*elements = \{ 172\.29\.100\.1, 172\.29\.100\.20 \}", text), text
    assert re.search(r"set engines_v6 \{[^}]*elements = \{ fd00::9 \}", text), text
    assert "tcp dport { 8000, 8001 } ip saddr @engines_v4 accept" in text
    assert "tcp dport { 8000, 8001 } ip6 saddr @engines_v6 accept" in text
    assert "tcp dport { 22 } accept" in text
    # the only other accepts are the essentials; the last rule drops the rest and carries the fingerprint
    assert re.search(r'counter drop comment "kvcache-ruleset [0-9a-f]{16}"\n\s*\}\n\}\s*$', text), text[-300:]
    accepts = [line.strip() for line in text.splitlines() if line.strip().endswith("accept")
               and not line.strip().startswith("type ")]
    # the DCGM exporter's port from the monitoring hosts and the controller (v4 and v6 sets)
    assert "tcp dport { 9450 } ip saddr @dcgm_exporter_v4 accept" in text
    assert "tcp dport { 9450 } ip6 saddr @dcgm_exporter_v6 accept" in text
    # the node-local metrics proxy's port from the same hosts
    assert "tcp dport { 9999 } ip saddr @metrics_proxy_v4 accept" in text
    assert "tcp dport { 9999 } ip6 saddr @metrics_proxy_v6 accept" in text
    assert len(accepts) == 13, accepts


def test_the_router_ruleset(rendered):
    text = rendered["router"]
    assert "tcp dport { 8001 } accept" in text
    assert "tcp dport { 29000 } ip saddr @router_metrics_v4 accept" in text
    assert "engines" not in text


def test_nft_accepts_the_rulesets(rendered, tmp_path):
    nft = shutil.which("nft") or ("/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else None)
    if nft is None or os.geteuid() != 0:
        pytest.skip("nft -c needs nft and CAP_NET_ADMIN")
    for host, text in rendered.items():
        path = tmp_path / ("%s.nft" % host)
        path.write_text(text)
        proc = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
            pytest.skip("nft -c needs CAP_NET_ADMIN")
        assert proc.returncode == 0, (host, proc.stderr, text)


def test_defaults_and_argument_specs_agree():
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    options = specs["main"]["options"]
    assert sorted(defaults) == sorted(options)
    for name, spec in options.items():
        assert spec.get("default") == defaults[name], name
    assert specs["checks"]["options"] == options


def test_json_round_trip_of_the_plan():
    # the role keeps the plan as a fact and the firewalld backend writes it as JSON
    plan = firewall_plan(hostvars(), "node1", GROUPS, SETTINGS)
    assert json.loads(json.dumps(plan)) == plan


def test_a_controller_given_twice_is_named_once():
    # the lab lists its gateway and the role also detects it from the container's default route
    plan = firewall_plan(hostvars(), "node1", GROUPS, dict(SETTINGS, controller_sources=["172.29.100.1", "172.29.100.1"]))
    assert rules(plan)["engines"]["from"] == "router hosts (router), controller (172.29.100.1)"

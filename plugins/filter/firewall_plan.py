# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""firewall_plan: what a fleet host's firewall admits, and from where, computed from the inventory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: firewall_plan
short_description: The inbound rules of one fleet host (ports and the fleet hosts that call them)
version_added: 0.1.0
description:
  - Computes, for one host of the inventory, every inbound port the platform needs open on it and
    the sources allowed to reach each one, split into IPv4 and IPv6. The C(kvcache_firewall) role
    renders it as an nftables table or as firewalld rich rules; preflight prints it as a table.
  - Every host - C(ssh) (the SSH ports, from anywhere or from the SSH sources), then the extra rules.
  - A node (in the node group) - C(engines), every vLLM instance's port, by the rule of the
    C(kvcache.offload.vllm_instances) filter (published, listed, or derived from the node's GPUs),
    from the router hosts, the monitoring hosts, the controller and the extra engine sources.
    With the production-stack router's C(kvaware) routing, C(lmcache_workers) too (the ports the
    node's in-process LMCache workers take commands on, from C(lmcache_controller_worker_port) up,
    one per TP rank) from the router hosts. The LMCache server's own ports stay on loopback - no rule.
    With C(kvcache_dcgm_exporter) (the fleet default, on), C(dcgm_exporter), C(kvcache_dcgm_exporter_port)
    (NVIDIA's DCGM exporter, GPU metrics) from the monitoring hosts and the controller.
    With C(kvcache_metrics_proxy) (the fleet default, on), C(metrics_proxy), C(kvcache_metrics_proxy_port)
    (the node-local metrics proxy, for the LMCache server's and the pruner's metrics) from the same hosts.
  - A router host - C(router_client), C(router_port) from the client sources (anywhere by
    default); C(router_metrics), C(router_metrics_port) (when it is not C(router_port)) from the monitoring
    hosts, the controller and C(router_metrics_allowed_sources), unless C(router_metrics_host) is a
    loopback address; with C(kvaware),
    C(lmcache_controller) (the LMCache controller's two ports) from the nodes. Router settings come
    from the C(kvcache.offload.router_settings) rule (the host's own, else the router role's defaults).
  - A lab S3 store (in the S3 store group) - C(s3), the port of C(kvcache_s3_endpoint), from the nodes,
    the storage controllers and the controller.
  - A fleet host's address is its C(ansible_host) when that is an IP address, else its default-route
    address from its gathered facts (the rule of C(kvcache.offload.internal_address), the one the
    listeners bind by). A host reached with the C(local) connection (or C(localhost) without an
    C(ansible_host)) is the controller, whose addresses are I(settings.controller_sources). A host whose
    address is not known yet is listed in C(unresolved) - the caller gathers its network facts and asks again.
  - Bad input (a source that is not an IP address or network, a network with host bits set, a port
    outside 1-65535, an unknown protocol) raises an error naming the host, the variable and the fix.
positional: host, groups, settings
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  host:
    description: Inventory name of the host whose rules are computed.
    type: str
    required: true
  groups:
    description: The C(groups) magic variable.
    type: dict
    required: true
  settings:
    description:
      - The role's settings - C(ssh_ports), C(ssh_sources), C(client_sources), C(controller_sources),
        C(engine_sources), C(allow) (a list of C({port, proto, sources, comment})), C(node_group),
        C(router_group), C(monitoring_group), C(s3_store_group), C(storage_controller_group).
      - Empty C(ssh_sources) or C(client_sources) mean anywhere; an C(allow) item without sources is
        open to anywhere.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: The rules of this host
  ansible.builtin.set_fact:
    plan: >-
      {{ hostvars | kvcache.offload.firewall_plan(inventory_hostname, groups, {
           'ssh_ports': [22], 'ssh_sources': [], 'client_sources': [],
           'controller_sources': ['10.20.0.2'], 'engine_sources': [], 'allow': []}) }}
# {"host": "gpu-a01", "unresolved": [], "rules": [
#   {"name": "ssh", "proto": "tcp", "ports": ["22"], "any": true, "v4": [], "v6": [], "from": "anywhere"},
#   {"name": "engines", "proto": "tcp", "ports": ["8000"], "any": false, "v4": ["10.20.0.2", "10.20.0.5"],
#    "v6": [], "from": "router hosts (router-01), controller"}], "firewalld": {...}}
"""

RETURN = r"""
_value:
  description: The host's rules.
  type: dict
  contains:
    host:
      description: The inventory name.
      type: str
    rules:
      description:
        - One item per allowed service - C(name), C(proto) (tcp or udp), C(ports) (strings, a range as
          C(a-b)), C(any) (open to every source), C(v4) and C(v6) (sorted, deduplicated addresses and
          networks), C(from) (who they are, for people), C(description).
      type: list
      elements: dict
    unresolved:
      description: Fleet hosts whose address is not known yet (gather their network facts and ask again).
      type: list
      elements: str
    instances_unknown:
      description: True when this host is a node whose vLLM instances are not known yet (gather gpu_facts).
      type: bool
    firewalld:
      description: The same rules for firewalld - C(ports) (C(port/proto) open to anywhere) and C(rich_rules).
      type: dict
    table:
      description: One line per rule for people (protocol, ports, sources, what and who).
      type: list
      elements: str
"""

import ipaddress
from collections.abc import Mapping


try:
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover
    from urlparse import urlsplit  # type: ignore

from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.module_utils.node_plan import (
    dcgm_exporter_port,
    lmcache_mode,
    metrics_proxy_port,
    role_defaults,
)
from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import (
    InstancesError,
    effective_instances,
)

PROTOCOLS = ("tcp", "udp")
GROUP_DEFAULTS = {
    "node_group": "kvcache_nodes",
    "router_group": "kvcache_router",
    "monitoring_group": "kvcache_monitoring",
    "s3_store_group": "kvcache_s3_store",
    "storage_controller_group": "kvcache_storage_controllers",
}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _get(hvars, key, default=None):
    try:
        value = hvars.get(key)
    except Exception:  # pylint: disable=broad-except
        value = None
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return default
    return value


def _router_settings(hostvars, host):
    """The router role's literal defaults overlaid with the host's router_* (kvcache.offload.router_settings)."""
    settings = {k: v for k, v in role_defaults("router").items() if k.startswith("router_")}
    try:
        hvars = hostvars[host]
    except KeyError:
        return settings
    try:
        keys = list(hvars.keys())
    except Exception:  # pylint: disable=broad-except
        keys = []
    for key in set(settings) | {k for k in keys if k.startswith("router_")}:
        value = _get(hvars, key)
        if value is not None:
            settings[key] = value
    return settings


def _is_loopback(value):
    value = str(value or "").strip().strip("[]").lower()
    if value == "localhost":
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def _source(host, variable, value):
    """One source as a normalised string and its family (4 or 6); errors name host, variable, fix."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    try:
        network = ipaddress.ip_network(text, strict=True) if text else None
    except ValueError as exc:
        if text and "has host bits set" in str(exc):
            loose = ipaddress.ip_network(text, strict=False)
            single = "%s/%d" % (text.split("/", maxsplit=1)[0], loose.max_prefixlen)
            raise AnsibleFilterError(
                "firewall_plan: host %s: %s is %r, a network with host bits set. Fix: write the network "
                "(%s) or the single address (%s)." % (host, variable, value, loose, single))
        network = None
    if network is None:
        raise AnsibleFilterError(
            "firewall_plan: host %s: %s is %r, not an IP address or network. Fix: give an IPv4 or IPv6 "
            "address or CIDR network (e.g. 10.20.0.5 or 10.20.0.0/24), not a host name." % (host, variable, value))
    if network.num_addresses == 1:
        return str(network.network_address), network.version
    return str(network), network.version


def _port(host, variable, value):
    """A port or a range a-b, as a string; errors name host, variable, fix."""
    def one(item):
        try:
            number = int(str(item).strip())
        except (TypeError, ValueError):
            return None
        return number if 1 <= number <= 65535 else None

    if isinstance(value, bool):
        low = high = None
    elif isinstance(value, str) and "-" in value:
        parts = value.split("-")
        low, high = (one(parts[0]), one(parts[1])) if len(parts) == 2 else (None, None)
    else:
        low = high = one(value)
    if low is None or high is None or low > high:
        raise AnsibleFilterError(
            "firewall_plan: host %s: %s is %r. Fix: give a port from 1 to 65535 (or a range such as "
            "'9400-9407')." % (host, variable, value))
    return str(low) if low == high else "%s-%s" % (low, high)


def _list(host, variable, value):
    if value is None:
        return []
    if isinstance(value, (str, Mapping)) or not hasattr(value, "__iter__"):
        raise AnsibleFilterError(
            "firewall_plan: host %s: %s must be a list, got %r. Fix: write it as a YAML list." % (host, variable, value))
    return list(value)


def _group(groups, name):
    try:
        return list(groups.get(name) or [])
    except AttributeError:
        return []


class _Resolver(object):
    """Addresses of fleet hosts: ansible_host, else the default-route address of the gathered facts."""

    def __init__(self, hostvars, controller):
        self.hostvars = hostvars
        self.controller = controller  # [(address, family)]
        self.unresolved = []

    def is_controller(self, host):
        try:
            hvars = self.hostvars[host]
        except KeyError:
            return host in _LOOPBACK_NAMES
        if str(_get(hvars, "ansible_connection", "")) in ("local", "ansible.builtin.local"):
            return True
        return host in _LOOPBACK_NAMES and _get(hvars, "ansible_host") in (None,) + _LOOPBACK_NAMES

    def addresses(self, host):
        if self.is_controller(host):
            return list(self.controller)
        hvars = self.hostvars[host]
        value = str(_get(hvars, "ansible_host", host)).strip().strip("[]")
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            address = None
            facts = _get(hvars, "ansible_facts", {})
            facts = facts if isinstance(facts, Mapping) else {}
            for key in ("default_ipv4", "default_ipv6"):
                route = facts.get(key)
                if isinstance(route, Mapping):
                    try:
                        address = ipaddress.ip_address(str(route.get("address", "")))
                        break
                    except ValueError:
                        continue
        if address is None:
            if host not in self.unresolved:
                self.unresolved.append(host)
            return []
        return [(str(address), address.version)]


def _rule(name, proto, ports, sources, who, description):
    """sources None: anywhere; else [(address, family)]."""
    v4 = sorted({a for a, f in sources or [] if f == 4}, key=_sort_key)
    v6 = sorted({a for a, f in sources or [] if f == 6}, key=_sort_key)
    ports = sorted(set(ports), key=lambda p: int(p.split("-")[0]))
    return {"name": name, "proto": proto, "ports": ports, "any": sources is None, "v4": v4, "v6": v6,
            "from": "anywhere" if sources is None else who, "description": description}


def _sort_key(text):
    network = ipaddress.ip_network(text, strict=False)
    return (network.version, int(network.network_address), network.prefixlen)


def _who(parts):
    """'router hosts (r1, r2), controller (10.0.0.2)': the non-empty parts, for people."""
    return ", ".join("%s (%s)" % (label, ", ".join(items)) for label, items in parts if items) or "nobody"


def _firewalld(rules):
    ports = []
    rich = []
    for rule in rules:
        for port in rule["ports"]:
            if rule["any"]:
                ports.append("%s/%s" % (port, rule["proto"]))
                continue
            for family, key in (("ipv4", "v4"), ("ipv6", "v6")):
                for source in rule[key]:
                    rich.append('rule family="%s" source address="%s" port port="%s" protocol="%s" accept'
                                % (family, source, port, rule["proto"]))
    return {"ports": sorted(set(ports)), "rich_rules": sorted(set(rich))}


def firewall_plan(hostvars, host, groups, settings):
    """The inbound rules of host (see DOCUMENTATION)."""
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError("firewall_plan: settings must be a mapping, got %r" % (settings,))
    if not isinstance(groups, Mapping):
        raise AnsibleFilterError("firewall_plan: groups must be the groups magic variable, got %r" % (groups,))
    try:
        hvars = hostvars[host]
    except KeyError:
        raise AnsibleFilterError("firewall_plan: host %s is not in hostvars" % host)
    names = dict(GROUP_DEFAULTS)
    names.update({k: v for k, v in settings.items() if k in GROUP_DEFAULTS and v})
    nodes = _group(groups, names["node_group"])
    routers = _group(groups, names["router_group"])
    monitoring = _group(groups, names["monitoring_group"])
    s3_stores = _group(groups, names["s3_store_group"])
    storage = _group(groups, names["storage_controller_group"])

    def sources(key):
        variable = "kvcache_firewall_%s" % key
        return [_source(host, "%s[%d]" % (variable, i), value)
                for i, value in enumerate(_list(host, variable, settings.get(key)))]

    controller = []
    for item in sources("controller_sources"):
        if item not in controller:
            controller.append(item)
    resolver = _Resolver(hostvars, controller)

    def fleet(*groups_of_hosts):
        """Addresses of the hosts of the given groups (the controller's for the controller)."""
        found = []
        for members in groups_of_hosts:
            for member in members:
                found.extend(resolver.addresses(member))
        return found

    def named(members):
        """The hosts people see by name: the controller is listed on its own."""
        return [m for m in members if not resolver.is_controller(m)]

    controller_who = ("controller", [a for a, _f in controller])
    rules = []
    ssh_ports = [_port(host, "kvcache_firewall_ssh_ports[%d]" % i, p)
                 for i, p in enumerate(_list(host, "kvcache_firewall_ssh_ports", settings.get("ssh_ports")))]
    if ssh_ports:
        ssh = sources("ssh_sources")
        rules.append(_rule("ssh", "tcp", ssh_ports, ssh or None,
                           _who([("kvcache_firewall_ssh_sources", [a for a, _f in ssh])]), "SSH"))

    instances_unknown = False
    kvaware = [r for r in routers
               if _router_settings(hostvars, r).get("router_implementation") == "production_stack"
               and _router_settings(hostvars, r).get("router_routing_logic") == "kvaware"]
    if host in nodes:
        try:
            instances = effective_instances(host, hvars)[0]
        except InstancesError as exc:
            raise AnsibleFilterError("firewall_plan: %s" % exc)
        if instances is None:
            instances_unknown = True
            instances = []
        ports = []
        ranks = 0
        for index, instance in enumerate(instances):
            if not isinstance(instance, Mapping):
                raise AnsibleFilterError(
                    "firewall_plan: host %s: vllm_instances[%d] is not a mapping (%r). Fix: give each instance "
                    "at least a port, e.g. {name: i0, port: 8000}." % (host, index, instance))
            ports.append(_port(host, "vllm_instances[%d].port" % index, instance.get("port")))
            ranks += int(instance.get("tensor_parallel_size") or _get(hvars, "kvcache_tensor_parallel_size", 1))
        extra = sources("engine_sources")
        if ports:
            rules.append(_rule(
                "engines", "tcp", ports, fleet(routers, monitoring) + controller + extra,
                _who([("router hosts", named(routers)), ("monitoring hosts", named(monitoring)), controller_who,
                      ("kvcache_firewall_engine_sources", [a for a, _f in extra])]),
                "vLLM instances (OpenAI API, /health, /metrics)"))
        # The node's mode as roles/kvcache derives it (in-process for the GDS tier), not "unset is in-process".
        try:
            mode = _get(hvars, "lmcache_mode") or lmcache_mode(host, hvars)
        except ValueError as error:
            raise AnsibleFilterError("firewall_plan: %s" % error)
        try:
            dcgm = dcgm_exporter_port(host, hvars)
            proxy = metrics_proxy_port(host, hvars)
        except ValueError as error:
            raise AnsibleFilterError("firewall_plan: %s" % error)
        if proxy is not None:
            rules.append(_rule("metrics_proxy", "tcp", [_port(host, "kvcache_metrics_proxy_port", proxy)],
                               fleet(monitoring) + controller,
                               _who([("monitoring hosts", named(monitoring)), controller_who]),
                               "node-local metrics proxy (LMCache server, pruner)"))
        if dcgm is not None:
            rules.append(_rule("dcgm_exporter", "tcp", [_port(host, "kvcache_dcgm_exporter_port", dcgm)],
                               fleet(monitoring) + controller,
                               _who([("monitoring hosts", named(monitoring)), controller_who]),
                               "NVIDIA DCGM exporter (GPU metrics)"))
        if kvaware and ranks and mode == "inprocess":
            first = int(_get(hvars, "lmcache_controller_worker_port",
                             role_defaults("lmcache").get("lmcache_controller_worker_port", 9400)))
            port = first if ranks == 1 else "%d-%d" % (first, first + ranks - 1)
            rules.append(_rule("lmcache_workers", "tcp", [_port(host, "lmcache_controller_worker_port", port)],
                               fleet(kvaware), _who([("router hosts", named(kvaware))]),
                               "LMCache workers (commands of the kvaware router's controller)"))

    if host in routers:
        router = _router_settings(hostvars, host)
        clients = sources("client_sources")
        rules.append(_rule("router_client", "tcp", [_port(host, "router_port", router.get("router_port"))],
                           clients or None, _who([("kvcache_firewall_client_sources", [a for a, _f in clients])]),
                           "router client endpoint"))
        metrics_host = router.get("router_metrics_host") or router.get("router_host")
        metrics_port = _port(host, "router_metrics_port", router.get("router_metrics_port"))
        if metrics_port != str(router.get("router_port")) and not _is_loopback(metrics_host):
            allowed = [_source(host, "router_metrics_allowed_sources[%d]" % i, value) for i, value in enumerate(
                _list(host, "router_metrics_allowed_sources", router.get("router_metrics_allowed_sources")))]
            rules.append(_rule("router_metrics", "tcp", [metrics_port], fleet(monitoring) + controller + allowed,
                               _who([("monitoring hosts", named(monitoring)), controller_who,
                                     ("router_metrics_allowed_sources", [a for a, _f in allowed])]),
                               "router /metrics"))
        if host in kvaware:
            ports = [_port(host, "router_lmcache_controller_port", router.get("router_lmcache_controller_port")),
                     _port(host, "router_lmcache_controller_reply_port",
                           router.get("router_lmcache_controller_reply_port"))]
            rules.append(_rule("lmcache_controller", "tcp", ports, fleet(nodes), _who([("nodes", named(nodes))]),
                               "LMCache controller (kvaware routing)"))

    if host in s3_stores:
        endpoint = str(_get(hvars, "kvcache_s3_endpoint", ""))
        try:
            parts = urlsplit(endpoint)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            port = None
        if port is None:
            raise AnsibleFilterError(
                "firewall_plan: host %s is an S3 store but kvcache_s3_endpoint is %r, not an http(s) URL. Fix: set "
                "kvcache_s3_endpoint to the store's URL (e.g. http://s3.lab.internal:8333)." % (host, endpoint))
        rules.append(_rule("s3", "tcp", [_port(host, "kvcache_s3_endpoint (its port)", port)],
                           fleet(nodes, storage) + controller,
                           _who([("nodes", named(nodes)), ("storage controllers", named(storage)), controller_who]),
                           "S3 store"))

    for index, item in enumerate(_list(host, "kvcache_firewall_allow", settings.get("allow"))):
        variable = "kvcache_firewall_allow[%d]" % index
        if not isinstance(item, Mapping) or "port" not in item:
            raise AnsibleFilterError(
                "firewall_plan: host %s: %s is %r. Fix: give a mapping with at least a port, e.g. "
                "{port: 9100, proto: tcp, sources: [10.20.0.9], comment: node exporter}." % (host, variable, item))
        proto = str(item.get("proto") or "tcp").lower()
        if proto not in PROTOCOLS:
            raise AnsibleFilterError(
                "firewall_plan: host %s: %s.proto is %r. Fix: use tcp or udp." % (host, variable, item.get("proto")))
        extra = [_source(host, "%s.sources[%d]" % (variable, i), s)
                 for i, s in enumerate(_list(host, variable + ".sources", item.get("sources")))]
        rules.append(_rule("allow_%d" % index, proto, [_port(host, variable + ".port", item.get("port"))],
                           extra or None, _who([(variable + ".sources", [a for a, _f in extra])]),
                           str(item.get("comment") or variable)))

    return {"host": str(host), "rules": rules, "unresolved": list(resolver.unresolved),
            "instances_unknown": instances_unknown, "firewalld": _firewalld(rules), "table": _table(rules)}


def _table(rules):
    """One line per rule, for people: protocol, ports, sources, who they are, what it is."""
    lines = []
    for rule in rules:
        sources = "anywhere" if rule["any"] else (", ".join(rule["v4"] + rule["v6"]) or "nobody")
        lines.append("%-5s %-12s from %s  [%s: %s]" % (rule["proto"], ",".join(rule["ports"]), sources,
                                                       rule["description"], rule["from"]))
    return lines


class FilterModule(object):
    """kvcache.offload firewall filters."""

    def filters(self):
        return {"firewall_plan": firewall_plan}

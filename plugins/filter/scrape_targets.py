# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""scrape_targets: Prometheus file_sd target groups for the platform, computed from the inventory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: scrape_targets
short_description: Prometheus file_sd target groups for vLLM instances, LMCache MP servers, the router, GPU or pruner metrics
version_added: 0.1.0
description:
  - Walks the hosts given, in inventory order, and returns one Prometheus file_sd target group
    (C({targets, labels})) per scrape target of one component.
  - C(vllm) gives every instance of the host (C({name, port})) at the host's C(ansible_host) (the
    inventory name when unset). A host's instances follow the rule of the
    C(kvcache.offload.vllm_instances) filter - the list the vllm role published on the node
    (C(vllm_effective_instances)), else the inventory's C(vllm_instances), else the role's derivation
    from the node's GPU count (C(vllm_gpu_count), else C(ansible_facts.gpu_facts.count)) and
    C(kvcache_tensor_parallel_size), ports from C(vllm_base_port) (both from I(defaults) when the host
    does not define them). A host whose instances are not known gives no target (the observability
    role gathers gpu_facts on such nodes first). LMCache in-process metrics are on the same
    C(/metrics), so they need no target of their own.
  - C(lmcache_mp) gives the LMCache multiprocess server of every host whose LMCache mode
    (C(lmcache_mode), else C(kvcache_lmcache_mode), else - as roles/kvcache derives it - C(inprocess)
    when the host sets C(kvcache_fs_gds) true and I(defaults)' C(kvcache_lmcache_mode) otherwise) is
    C(multiprocess), at port
    C(lmcache_mp_http_port). Its address is C(lmcache_mp_http_host) when that is a concrete
    address, the host's C(ansible_host) when it is a wildcard (C(0.0.0.0), C(::)), and, when it is a
    loopback address (the default, since the admin API has no authentication), what I(loopback) says.
  - C(router) gives the router's C(/metrics) of every host, at C(router_metrics_port) (and
    C(router_metrics_host) when concrete), for both implementations - the router role's front
    serves them there (plain HTTP, to the monitoring hosts); the client port C(router_port) is
    TLS and refuses C(/metrics).
  - C(dcgm) gives NVIDIA's DCGM exporter of every host (GPU metrics) when C(kvcache_dcgm_exporter) is true (the
    host's, else roles/kvcache's default), at C(kvcache_dcgm_exporter_port) on the host's
    C(nvidia_driver_dcgm_exporter_address), else its C(ansible_host) (the internal address the exporter binds to).
  - With the node-local metrics proxy (C(kvcache_metrics_proxy), the fleet default, on; role kvcache_metrics_proxy),
    a loopback-bound C(lmcache_mp) server is scraped through it instead, at C(kvcache_metrics_proxy_port) on the
    node's C(kvcache_metrics_proxy_address), else its C(ansible_host), with the labels C(__metrics_path__=/proxy) and
    C(__param_module=lmcache) (Prometheus takes the path and the URL's parameters from them).
  - C(prune) gives the fs tier's pruner metrics (its metrics file) through the same proxy (C(module=kvcache_prune))
    on every host that prunes, by the kvcache_prune role's rule (the fs tier; C(kvcache_prune_scope) all, or the host
    first in C(kvcache_prune_fleet_group)); none where C(kvcache_prune_metrics_file) is set empty, and none without the
    proxy (node_exporter's textfile collector reads the file then).
  - A variable a host does not define is taken from I(defaults) (the roles' defaults are not in
    C(hostvars) unless the role ran in the same play). IPv6 addresses are put in brackets.
  - Labels on every group - C(kvcache_component), C(kvcache_node) (inventory name) and
    C(kvcache_instance); the router's also has C(kvcache_router_implementation).
  - A malformed instance or port, or the same address and port twice, is an error that names the host.
positional: hosts, component
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: Inventory names of the hosts to walk, e.g. C(groups['kvcache_nodes']).
    type: list
    elements: str
    required: true
  component:
    description: Which component's targets to return.
    type: str
    required: true
    choices: [vllm, lmcache_mp, router, dcgm, prune]
  defaults:
    description:
      - Values for variables a host does not define, for example C(lmcache_mp_http_port=8080),
        C(lmcache_mp_http_host=127.0.0.1), C(kvcache_lmcache_mode=multiprocess), C(router_port=8001),
        C(router_metrics_port=29000) and C(router_implementation=vllm_router).
    type: dict
    default: {}
  loopback:
    description:
      - What to do with an LMCache MP server bound to a loopback address, which a Prometheus on
        another host cannot reach. C(skip) leaves it out, C(keep) emits C(127.0.0.1:<port>) (for an
        agent that runs on every node and scrapes its own node), C(fail) raises an error naming the host.
    type: str
    default: skip
    choices: [skip, keep, fail]
"""

EXAMPLES = r"""
- name: Targets of every vLLM instance
  ansible.builtin.set_fact:
    vllm_targets: "{{ hostvars | kvcache.offload.scrape_targets(groups['kvcache_nodes'], 'vllm') }}"
# [{"targets": ["10.0.0.11:8000"],
#   "labels": {"kvcache_component": "vllm", "kvcache_node": "gpu1", "kvcache_instance": "gpu1-0"}}, ...]

- name: Targets of the LMCache MP servers bound to an internal address
  ansible.builtin.set_fact:
    mp_targets: >-
      {{ hostvars | kvcache.offload.scrape_targets(groups['kvcache_nodes'], 'lmcache_mp',
         defaults={'lmcache_mp_http_port': 8080, 'lmcache_mp_http_host': '127.0.0.1',
                   'kvcache_lmcache_mode': 'multiprocess'}) }}
"""

RETURN = r"""
_value:
  description: One file_sd target group per scrape target, in inventory order.
  type: list
  elements: dict
  contains:
    targets:
      description: One C(<address>:<port>).
      type: list
      elements: str
    labels:
      description: C(kvcache_component), C(kvcache_node), C(kvcache_instance) (and C(kvcache_router_implementation)).
      type: dict
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.module_utils.node_plan import (
    dcgm_exporter_port,
    lmcache_mode,
    metrics_proxy_port,
    prune_active,
)
from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import (
    InstancesError,
    effective_instances,
)

COMPONENTS = ("vllm", "lmcache_mp", "router", "dcgm", "prune")
LOOPBACK = ("skip", "keep", "fail")
_WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")


def _lookup(hvars, key, defaults):
    """A host variable, else defaults[key], else None (HostVars raise on some undefined lookups)."""
    try:
        value = hvars.get(key)
    except Exception:  # pylint: disable=broad-except
        value = None
    if value is None or (isinstance(value, str) and value.strip() == ""):
        value = defaults.get(key)
    return value


def _is_loopback(address):
    address = address.strip("[]").lower()
    return address == "localhost" or address.startswith("127.") or address == "::1"


def _bracket(address):
    address = str(address)
    if ":" in address and not address.startswith("["):
        return "[%s]" % address
    return address


def _port(host, what, value):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or not 1 <= number <= 65535:
        raise AnsibleFilterError(
            "scrape_targets: host %s: %s is %r. Fix: set %s to an integer 1-65535 for %s."
            % (host, what, value, what.split("[")[0], host))
    return number


def _group(host, address, port, component, instance, extra=None):
    labels = {"kvcache_component": component, "kvcache_node": str(host), "kvcache_instance": str(instance)}
    labels.update(extra or {})
    return {"targets": ["%s:%d" % (_bracket(address), port)], "labels": labels}


def _vllm(host, hvars, defaults):
    try:
        instances = effective_instances(host, hvars, defaults)[0] or []
    except InstancesError as exc:
        raise AnsibleFilterError("scrape_targets: %s" % exc)
    address = _lookup(hvars, "ansible_host", {}) or host
    groups = []
    for index, instance in enumerate(instances):
        if not isinstance(instance, Mapping):
            raise AnsibleFilterError(
                "scrape_targets: host %s: vllm_instances[%d] is not a mapping (%r). "
                "Fix: give each instance a name and a port, e.g. {name: i0, port: 8000}." % (host, index, instance))
        port = _port(host, "vllm_instances[%d].port" % index, instance.get("port"))
        name = instance.get("name") or "%s-%d" % (host, index)
        groups.append(_group(host, address, port, "vllm", name))
    return groups


def _lmcache_mp(host, hvars, defaults, loopback):
    # Unset on the host: roles/kvcache's derivation of its default (in-process for the GDS tier only),
    # with the defaults' mode for a node that sets neither.
    try:
        mode = _lookup(hvars, "lmcache_mode", {}) or lmcache_mode(host, hvars, defaults.get("kvcache_lmcache_mode"))
    except ValueError as error:
        raise AnsibleFilterError("scrape_targets: %s" % error)
    if mode != "multiprocess":
        return []
    port = _port(host, "lmcache_mp_http_port", _lookup(hvars, "lmcache_mp_http_port", defaults))
    bind = str(_lookup(hvars, "lmcache_mp_http_host", defaults) or "127.0.0.1")
    if bind in _WILDCARDS:
        address = _lookup(hvars, "ansible_host", {}) or host
    elif _is_loopback(bind):
        proxied = _proxied(host, hvars, "lmcache", "lmcache_mp", "%s-lmcache" % host)
        if proxied:
            return proxied
        if loopback == "skip":
            return []
        if loopback == "fail":
            raise AnsibleFilterError(
                "scrape_targets: host %s: the LMCache MP server's HTTP port (metrics) is bound to %s, "
                "which Prometheus on another host cannot reach. Fix: set lmcache_mp_http_host for %s to "
                "an internal address (the admin API on that port has no authentication: never a public "
                "one), or scrape it with an agent on the node." % (host, bind, host))
        address = bind
    else:
        address = bind
    return [_group(host, address, port, "lmcache_mp", "%s-lmcache" % host)]


def _router(host, hvars, defaults):
    implementation = _lookup(hvars, "router_implementation", defaults) or "vllm_router"
    address = _lookup(hvars, "ansible_host", {}) or host
    # Both implementations: the router role's front serves /metrics on router_metrics_port.
    port = _port(host, "router_metrics_port", _lookup(hvars, "router_metrics_port", defaults))
    bind = str(_lookup(hvars, "router_metrics_host", defaults) or "")
    if bind not in _WILDCARDS and not _is_loopback(bind):
        address = bind
    return [_group(host, address, port, "router", host, {"kvcache_router_implementation": str(implementation)})]


def _dcgm(host, hvars):
    # The node's own settings, else the fleet's (roles/kvcache): the exporter listens on the node's
    # internal address (nvidia_driver), which is ansible_host when that is an address.
    try:
        port = dcgm_exporter_port(host, hvars)
    except ValueError as error:
        raise AnsibleFilterError("scrape_targets: %s" % error)
    if port is None:
        return []
    address = _lookup(hvars, "nvidia_driver_dcgm_exporter_address", {}) or _lookup(hvars, "ansible_host", {}) or host
    return [_group(host, address, port, "dcgm", "%s-gpus" % host)]


def _proxied(host, hvars, module, component, instance):
    """The node's metrics proxy serving one module (/proxy?module=<module>), or [] when the fleet runs none.
    Prometheus takes __metrics_path__ and __param_<name> from a target's labels."""
    try:
        port = metrics_proxy_port(host, hvars)
    except ValueError as error:
        raise AnsibleFilterError("scrape_targets: %s" % error)
    if port is None:
        return []
    address = _lookup(hvars, "kvcache_metrics_proxy_address", {}) or _lookup(hvars, "ansible_host", {}) or host
    return [_group(host, address, port, component, instance, {"__metrics_path__": "/proxy", "__param_module": module})]


def _prune(host, hvars):
    # The pruner's metrics file, on the node that prunes (kvcache_prune's rule), through the node's proxy;
    # none when the node writes no metrics file (kvcache_prune_metrics_file set empty: no module either).
    try:
        metrics_file = hvars.get("kvcache_prune_metrics_file")
    except Exception:  # pylint: disable=broad-except
        metrics_file = None
    if metrics_file is not None and str(metrics_file).strip() == "":
        return []
    if not prune_active(host, hvars):
        return []
    return _proxied(host, hvars, "kvcache_prune", "prune", "%s-prune" % host)


def scrape_targets(hostvars, hosts, component, defaults=None, loopback="skip"):
    """Return file_sd target groups for one component on the given hosts."""
    if component not in COMPONENTS:
        raise AnsibleFilterError("scrape_targets: component must be one of %s, got %r" % (", ".join(COMPONENTS), component))
    if loopback not in LOOPBACK:
        raise AnsibleFilterError("scrape_targets: loopback must be one of %s, got %r" % (", ".join(LOOPBACK), loopback))
    if hosts is None:
        hosts = []
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError("scrape_targets: hosts must be a list of inventory host names, got %r" % (hosts,))
    defaults = dict(defaults or {})
    groups = []
    seen = {}
    for host in hosts:
        try:
            hvars = hostvars[host]
        except KeyError:
            raise AnsibleFilterError("scrape_targets: host %s is not in hostvars" % host)
        if component == "vllm":
            found = _vllm(host, hvars, defaults)
        elif component == "lmcache_mp":
            found = _lmcache_mp(host, hvars, defaults, loopback)
        elif component == "dcgm":
            found = _dcgm(host, hvars)
        elif component == "prune":
            found = _prune(host, hvars)
        else:
            found = _router(host, hvars, defaults)
        for group in found:
            target = group["targets"][0]
            if target in seen and not target.startswith(("127.", "[::1]")):
                raise AnsibleFilterError(
                    "scrape_targets: host %s: %s target %s is also %s. Fix: give every %s its own address and port."
                    % (host, component, target, seen[target], component))
            seen[target] = "%s/%s" % (host, group["labels"]["kvcache_instance"])
            groups.append(group)
    return groups


class FilterModule(object):
    """kvcache.offload observability filters."""

    def filters(self):
        return {"scrape_targets": scrape_targets}

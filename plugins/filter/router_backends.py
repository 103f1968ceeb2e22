# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_backends: the router's backend list, computed from the inventory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: router_backends
short_description: Every vLLM instance of every node, as router backends
version_added: 0.1.0
description:
  - Walks the hosts of a group (normally C(kvcache_nodes)) in inventory order and, for each
    instance of the host, returns one backend with its URL and model name.
  - A host's instances follow the rule of the C(kvcache.offload.vllm_instances) filter - the list
    the vllm role published on the node (C(vllm_effective_instances)), else the inventory's
    C(vllm_instances), else the role's derivation from the node's GPU count (C(vllm_gpu_count), else
    C(ansible_facts.gpu_facts.count)) and C(kvcache_tensor_parallel_size), ports from C(vllm_base_port).
  - The URL is C(<scheme>://<address>:<port>), where the address is the host's C(ansible_host)
    (the inventory name when unset); IPv6 addresses are put in brackets. The scheme is
    C(https) for a host whose C(kvcache_engine_tls) is true (its engines serve TLS), else C(http),
    unless I(scheme) names one for every host.
  - The model name is the host's C(kvcache_served_model_name), else its C(kvcache_model), else
    I(default_model). A backend whose model cannot be found has C(model=None), so the caller can
    fail with a message that names the host.
  - A host whose instances are not known (none published, none listed, no GPU facts) contributes
    no backend (the router role gathers gpu_facts on such nodes first, and fails on an empty list),
    a malformed instance (not a mapping, no port, a port that is not an integer 1-65535) is an
    error that names the host.
positional: groups
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  groups:
    description: Inventory names of the hosts to walk, e.g. C(groups['kvcache_nodes']).
    type: list
    elements: str
    required: true
  scheme:
    description:
      - URL scheme of every instance. Unset or empty - each host's own, from its C(kvcache_engine_tls)
        (the kvcache role's default when the host does not set it).
    type: str
  default_model:
    description: Model name for hosts that define neither C(kvcache_served_model_name) nor C(kvcache_model).
    type: str
  defaults:
    description: Values for C(kvcache_tensor_parallel_size) and C(vllm_base_port) when a host does not define them.
    type: dict
    default: {kvcache_tensor_parallel_size: 1, vllm_base_port: 8000}
"""

EXAMPLES = r"""
- name: Compute the router's backends from the nodes' instances
  ansible.builtin.set_fact:
    backends: "{{ hostvars | kvcache.offload.router_backends(groups['kvcache_nodes'] | default([])) }}"
# [{"url": "http://10.0.0.11:8000", "model": "qwen", "host": "gpu1", "instance": "gpu1-0"}, ...]
"""

RETURN = r"""
_value:
  description: One item per instance, in inventory order.
  type: list
  elements: dict
  contains:
    url:
      description: Base URL of the instance.
      type: str
    model:
      description: Model name the instance serves (None when it cannot be found).
      type: str
    host:
      description: Inventory name of the node.
      type: str
    instance:
      description: Instance name (C(name) of the item, else C(<host>-<index>)).
      type: str
"""

import functools
import os
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import (
    InstancesError,
    effective_instances,
)

_MODEL_VARS = ("kvcache_served_model_name", "kvcache_model")
KVCACHE_DEFAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                                "roles", "kvcache", "defaults", "main.yml")


@functools.lru_cache(maxsize=None)
def _engine_tls_default(path=KVCACHE_DEFAULTS):
    """The kvcache role's default of kvcache_engine_tls (read from the role: one place)."""
    with open(path, encoding="utf-8") as handle:
        return bool(boolean((yaml.safe_load(handle) or {}).get("kvcache_engine_tls", False), strict=True))


def engine_scheme(hvars):
    """https when the host's engines serve TLS (kvcache_engine_tls), else http."""
    value = _lookup(hvars, "kvcache_engine_tls")
    if value is None:
        return "https" if _engine_tls_default() else "http"
    try:
        return "https" if boolean(value, strict=True) else "http"
    except TypeError:
        raise AnsibleFilterError(
            "router_backends: kvcache_engine_tls is %r, not a boolean. Fix: set kvcache_engine_tls to true or false." % (value,))


def _lookup(hvars, key):
    """Value of one host variable, or None (HostVars raise on some undefined lookups)."""
    try:
        value = hvars.get(key)
    except Exception:  # pylint: disable=broad-except
        return None
    if value is None or str(value).strip() == "":
        return None
    return value


def _address(host, hvars):
    address = str(_lookup(hvars, "ansible_host") or host)
    if ":" in address and not address.startswith("["):
        address = "[%s]" % address
    return address


def router_backends(hostvars, groups, scheme=None, default_model=None, defaults=None):
    """Return [{url, model, host, instance}] for every instance of every host in groups."""
    if groups is None:
        groups = []
    if isinstance(groups, str) or not hasattr(groups, "__iter__"):
        raise AnsibleFilterError("router_backends: groups must be a list of inventory host names, got %r" % (groups,))
    backends = []
    seen = {}
    for host in groups:
        try:
            hvars = hostvars[host]
        except KeyError:
            raise AnsibleFilterError("router_backends: host %s is not in hostvars" % host)
        try:
            instances = effective_instances(host, hvars, defaults)[0] or []
        except InstancesError as exc:
            raise AnsibleFilterError("router_backends: %s" % exc)
        model = None
        for var in _MODEL_VARS:
            model = _lookup(hvars, var)
            if model is not None:
                break
        if model is None:
            model = default_model
        address = _address(host, hvars)
        for index, instance in enumerate(instances):
            if not isinstance(instance, Mapping):
                raise AnsibleFilterError(
                    "router_backends: host %s: vllm_instances[%d] is not a mapping (%r). "
                    "Fix: give each instance at least a port, e.g. {name: i0, port: 8000}." % (host, index, instance))
            port = instance.get("port")
            try:
                port_number = int(port)
            except (TypeError, ValueError):
                port_number = 0
            if isinstance(port, bool) or not 1 <= port_number <= 65535:
                raise AnsibleFilterError(
                    "router_backends: host %s: vllm_instances[%d] has port %r. "
                    "Fix: set port to an integer 1-65535 for that instance." % (host, index, port))
            url = "%s://%s:%d" % (scheme or engine_scheme(hvars), address, port_number)
            if url in seen:
                raise AnsibleFilterError(
                    "router_backends: host %s: vllm_instances[%d] has the same URL %s as %s. "
                    "Fix: give every instance its own address and port." % (host, index, url, seen[url]))
            name = str(instance.get("name") or "%s-%d" % (host, index))
            seen[url] = "%s/%s" % (host, name)
            backends.append({
                "url": url,
                "model": None if model is None else str(model),
                "host": str(host),
                "instance": name,
            })
    return backends


class FilterModule(object):
    """kvcache.offload router filters."""

    def filters(self):
        return {"router_backends": router_backends}

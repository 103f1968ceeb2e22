# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_instances: each node's vLLM instances as the controller sees them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: vllm_instances
short_description: Each node's vLLM instances (published, listed or derived from its GPUs)
version_added: 0.1.0
description:
  - For each host given, the instances the vllm role runs there, by one rule shared with the
    C(kvcache.offload.router_backends) and C(kvcache.offload.scrape_targets) filters.
  - The list the vllm role published on the node (C(vllm_effective_instances), set by the role
    in every run, check mode included), else the inventory C(vllm_instances) when not empty,
    else the role's derivation from the node's GPU count (C(vllm_gpu_count) when the inventory sets
    it, else C(ansible_facts.gpu_facts.count)), one instance per C(kvcache_tensor_parallel_size)
    GPUs, named C(gpu<first GPU>), ports from C(vllm_base_port) up.
  - C(None) for a host where none of these is known (no role ran there in this run and no
    gpu_facts were gathered); the caller gathers C(kvcache.offload.gpu_facts) on the node
    (delegated) or fails, and never reads that as "no instance".
positional: hosts
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: Inventory names of the nodes, e.g. C(groups['kvcache_nodes']).
    type: list
    elements: str
    required: true
  defaults:
    description: Values for C(kvcache_tensor_parallel_size) and C(vllm_base_port) when a host does not define them.
    type: dict
    default: {kvcache_tensor_parallel_size: 1, vllm_base_port: 8000}
"""

EXAMPLES = r"""
- name: Nodes whose instances are not known yet
  ansible.builtin.set_fact:
    unknown: >-
      {{ hostvars | kvcache.offload.vllm_instances(groups['kvcache_nodes'])
         | dict2items | selectattr('value', 'none') | map(attribute='key') | list }}
"""

RETURN = r"""
_value:
  description: Inventory name -> list of instances ({name, port, gpus, ...}), or None when unknown.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import (
    InstancesError,
    derive_node_instances,
    effective_instances,
)


def vllm_instances(hostvars, hosts, defaults=None):
    """Return {host: instances or None} for the given hosts."""
    if hosts is None:
        hosts = []
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError("vllm_instances: hosts must be a list of inventory host names, got %r" % (hosts,))
    result = {}
    for host in hosts:
        try:
            hvars = hostvars[host]
        except KeyError:
            raise AnsibleFilterError("vllm_instances: host %s is not in hostvars" % host)
        try:
            result[str(host)] = effective_instances(host, hvars, defaults)[0]
        except InstancesError as exc:
            raise AnsibleFilterError("vllm_instances: %s" % exc)
    return result


def vllm_derive_instances(gpu_count, tensor_parallel_size=1, base_port=8000, host="this host"):
    """The vllm role's derivation on the node itself (roles/vllm/vars/main.yml): one instance
    per tensor_parallel_size GPUs of gpu_count, named gpu<first GPU>, ports from base_port up.
    The same code the controller-side readers use (effective_instances), so the two never differ."""
    try:
        return derive_node_instances(host, gpu_count, tensor_parallel_size, base_port)
    except InstancesError as exc:
        raise AnsibleFilterError("vllm_derive_instances: %s" % exc)


class FilterModule(object):
    """kvcache.offload instance filters."""

    def filters(self):
        return {"vllm_instances": vllm_instances, "vllm_derive_instances": vllm_derive_instances}

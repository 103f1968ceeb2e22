# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM instances of a node as the controller sees them in hostvars.

One rule for every reader (the router's backends, the Prometheus targets): the vllm role's
published list (``vllm_effective_instances``, set on the node by the role, derived or listed),
else the inventory's ``vllm_instances``, else the same derivation the vllm role makes from the
node's GPUs (``vllm_gpu_count`` when the inventory sets it, else ``ansible_facts.gpu_facts.count``):
one instance per ``kvcache_tensor_parallel_size`` GPUs, named ``gpu<first GPU>``, ports from
``vllm_base_port`` up. ``None`` when none of these is known (the caller gathers gpu_facts on the
node or fails).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from collections.abc import Mapping

# The vllm role's defaults the derivation needs when the host does not define them.
DERIVATION_DEFAULTS = {"kvcache_tensor_parallel_size": 1, "vllm_base_port": 8000}


class InstancesError(ValueError):
    """An input the derivation cannot use; the message names the host and the variable."""


def host_value(hvars, key):
    """One host variable or None (HostVars raise on some undefined lookups)."""
    try:
        value = hvars.get(key)
    except Exception:  # pylint: disable=broad-except
        return None
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    return value


def _positive_int(host, name, value, minimum):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise InstancesError(
            "host %s: %s is %r. Fix: set %s to an integer >= %d for %s." % (host, name, value, name, minimum, host))
    return number


def derive_instances(gpu_count, tensor_parallel_size=1, base_port=8000):
    """The one derivation rule: one instance per TP group of GPUs. The vllm role runs it on the
    node (filter kvcache.offload.vllm_derive_instances in roles/vllm/vars/main.yml), the router
    and the monitoring on the controller (effective_instances)."""
    instances = []
    for index in range(int(gpu_count) // int(tensor_parallel_size)):
        first = index * int(tensor_parallel_size)
        instances.append({
            "name": "gpu%d" % first,
            "port": int(base_port) + index,
            "gpus": list(range(first, first + int(tensor_parallel_size))),
        })
    return instances


def derive_node_instances(host, gpu_count, tensor_parallel_size, base_port):
    """derive_instances after checking its inputs; InstancesError names the host and the variable."""
    count = _positive_int(host, "vllm_gpu_count", gpu_count, 0)
    tp = _positive_int(host, "kvcache_tensor_parallel_size", tensor_parallel_size, 1)
    port = _positive_int(host, "vllm_base_port", base_port, 1)
    return derive_instances(count, tp, port)


def gpu_count_of(hvars):
    """The node's GPU count the controller can see: vllm_gpu_count, else gpu_facts.count, else None."""
    count = host_value(hvars, "vllm_gpu_count")
    if count is None:
        facts = host_value(hvars, "ansible_facts")
        gpu_facts = facts.get("gpu_facts") if isinstance(facts, Mapping) else None
        if isinstance(gpu_facts, Mapping):
            count = gpu_facts.get("count")
    return count


def effective_instances(host, hvars, defaults=None):
    """Return (instances, source) for one host; instances is None when unknown.

    source is 'published' (vllm_effective_instances), 'inventory' (vllm_instances),
    'derived' (from the GPU count) or 'unknown'.
    """
    values = dict(DERIVATION_DEFAULTS)
    values.update(defaults or {})
    for source, key in (("published", "vllm_effective_instances"), ("inventory", "vllm_instances")):
        instances = host_value(hvars, key)
        if instances is None:
            continue
        if isinstance(instances, (Mapping, str)) or not hasattr(instances, "__iter__"):
            raise InstancesError(
                "host %s: %s must be a list of instances ({name, port, gpus, tensor_parallel_size}), "
                "got %r. Fix: make %s a list for %s." % (host, key, instances, key, host))
        instances = list(instances)
        if instances or source == "published":
            return instances, source
    count = gpu_count_of(hvars)
    if count is None:
        return None, "unknown"
    tp = host_value(hvars, "kvcache_tensor_parallel_size")
    port = host_value(hvars, "vllm_base_port")
    return derive_node_instances(
        host, count,
        values["kvcache_tensor_parallel_size"] if tp is None else tp,
        values["vllm_base_port"] if port is None else port), "derived"

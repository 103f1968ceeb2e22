# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_lmcache_mode: a node's LMCache mode as the controller sees it in hostvars."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: node_lmcache_mode
short_description: A node's LMCache mode (its own, else as roles/kvcache derives it)
version_added: 0.1.0
description:
  - The LMCache mode of a node read from another host (the router's checks), where C(hostvars)
    holds the node's inventory but no role default.
  - The node's C(kvcache_lmcache_mode), else roles/kvcache's derivation from the node's own
    C(kvcache_fs_gds) (C(inprocess) for the GDS tier, else C(multiprocess)), never the caller's
    value.
positional: hostvars
options:
  _input:
    description: Inventory name of the node.
    type: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: The LMCache mode of every node
  ansible.builtin.debug:
    msg: "{{ groups['kvcache_nodes'] | map('kvcache.offload.node_lmcache_mode', hostvars) | list }}"
"""

RETURN = r"""
_value:
  description: C(multiprocess) or C(inprocess).
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.module_utils.node_plan import lmcache_mode


def node_lmcache_mode(host, hostvars):
    """The node's LMCache mode: its own setting, else roles/kvcache's derivation for that node."""
    try:
        hvars = hostvars[host]
    except KeyError:
        raise AnsibleFilterError("node_lmcache_mode: %s is not in the inventory. Fix: pass a host of groups['kvcache_nodes']."
                                 % host)
    try:
        return lmcache_mode(host, hvars)
    except ValueError as error:
        raise AnsibleFilterError("node_lmcache_mode: %s" % error)


class FilterModule(object):
    """kvcache.offload node plan filters."""

    def filters(self):
        return {"node_lmcache_mode": node_lmcache_mode}

# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ontap_export_clients: the client matches of the tier's ONTAP export rule, and what is wrong with the input."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: ontap_export_clients
short_description: The client matches of the shared tier's ONTAP export rule (one host match per node)
version_added: 0.1.0
description:
  - Takes the GPU nodes' storage-network addresses (a mapping of inventory host to C(ontap_nfs_client_address), one
    address or a list) and returns the C(clients) an ONTAP export rule should name - every node as a host match
    (C(a.b.c.d/32), C(x::y/128)) - plus the operator's explicit subnets, and the C(problems) that make the input
    unusable.
  - A node address must be one IPv4 or IPv6 address (or the same with a host prefix, C(/32) or C(/128)). A subnet, a
    host name, a netgroup (C(@name)) or a domain (C(.example.com)) is a problem - ONTAP would let in every host it
    matches, or whatever the name resolves to.
  - A subnet (C(cidrs)) must be a network address with its prefix (C(10.30.0.0/24), no host bits), no wider than
    C(min_prefix_v4) / C(min_prefix_v6); C(0.0.0.0/0), C(::/0) and anything wider than the floor are problems.
  - C(clients) keeps the order of the input (nodes in inventory order, then the subnets) without duplicates.
positional: clients, cidrs, min_prefix_v4, min_prefix_v6
options:
  _input:
    description: Inventory host name to that node's storage address(es) (C(ontap_nfs_client_address)).
    type: dict
    required: true
  clients:
    description:
      - The inventory's own list of node addresses (C(ontap_nfs_clients)). When not empty it replaces the addresses of
        C(_input) (a problem there is named after C(ontap_nfs_clients)).
    type: list
    elements: str
    default: []
  cidrs:
    description: Subnets the operator lets in explicitly (C(ontap_nfs_client_cidrs)).
    type: list
    elements: str
    default: []
  min_prefix_v4:
    description: The widest IPv4 subnet accepted in C(cidrs), as a prefix length.
    type: int
    default: 16
  min_prefix_v6:
    description: The widest IPv6 subnet accepted in C(cidrs), as a prefix length.
    type: int
    default: 48
"""

EXAMPLES = r"""
- name: The export rule's clients from the nodes' host_vars
  ansible.builtin.debug:
    msg: "{{ {'gpu-a': '10.30.0.21', 'gpu-b': ['10.30.0.22', 'fd00:30::22']} | kvcache.offload.ontap_export_clients }}"
# {"clients": ["10.30.0.21/32", "10.30.0.22/32", "fd00:30::22/128"], "problems": []}

- name: A subnet where a node address belongs, and an open subnet
  ansible.builtin.debug:
    msg: "{{ {'gpu-a': '10.30.0.0/24'} | kvcache.offload.ontap_export_clients([], ['0.0.0.0/0']) }}"
# problems: "gpu-a's ontap_nfs_client_address '10.30.0.0/24' is a subnet, not one node's address ...",
#           "ontap_nfs_client_cidrs '0.0.0.0/0' lets in every IPv4 host ..."
"""

RETURN = r"""
_value:
  description:
    - C(clients) - the export rule's client matches (strings).
    - C(problems) - one sentence per unusable input, naming the host or variable and the value (empty when all is
      well).
  type: dict
"""

import ipaddress

from ansible.module_utils.six import string_types

NODE_VARIABLE = "ontap_nfs_client_address"
LIST_VARIABLE = "ontap_nfs_clients"
CIDR_VARIABLE = "ontap_nfs_client_cidrs"


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, string_types):
        return [value]
    return list(value)


def _host_match(value):
    """'a.b.c.d/32' or 'x::y/128' for one address (optionally already with its host prefix); None otherwise."""
    text = str(value).strip()
    try:
        address = ipaddress.ip_address(text)
        return "%s/%d" % (address.compressed, address.max_prefixlen)
    except ValueError:
        pass
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError:
        return None
    if network.prefixlen == network.max_prefixlen:
        return network.with_prefixlen
    return None


def _is_subnet(value):
    try:
        network = ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        return False
    return network.prefixlen < network.max_prefixlen


def _node_problem(where, value):
    if _is_subnet(value):
        why = ("is a subnet, not one node's address: ONTAP would let in every host in it. Give the node's own "
               "address, and put a subnet you really mean to open in %s" % CIDR_VARIABLE)
    else:
        why = ("is not an IPv4 or IPv6 address (a host name, netgroup or domain lets in whatever it resolves to "
               "or matches)")
    return "%s '%s' %s" % (where, value, why)


def _cidr_match(value, min_prefix_v4, min_prefix_v6):
    """(match, problem) for one subnet of ontap_nfs_client_cidrs."""
    text = str(value).strip()
    if "/" not in text:
        return None, ("%s '%s' has no prefix length: write the subnet as network/prefix (e.g. 10.30.0.0/24), or put "
                      "a single node's address in its %s" % (CIDR_VARIABLE, value, NODE_VARIABLE))
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "host bits set" in str(exc):
            try:
                fixed = ipaddress.ip_network(text, strict=False).with_prefixlen
            except ValueError:
                fixed = "network/prefix"
            return None, "%s '%s' has host bits set: write the network, %s" % (CIDR_VARIABLE, value, fixed)
        return None, "%s '%s' is not a subnet (network/prefix, e.g. 10.30.0.0/24)" % (CIDR_VARIABLE, value)
    floor = min_prefix_v4 if network.version == 4 else min_prefix_v6
    if network.prefixlen == 0:
        return None, "%s '%s' lets in every IPv%d host" % (CIDR_VARIABLE, value, network.version)
    if network.prefixlen < floor:
        return None, ("%s '%s' is wider than /%d (ontap_nfs_client_cidr_min_prefix_v%d): it would let in %d addresses"
                      % (CIDR_VARIABLE, value, floor, network.version, network.num_addresses))
    return network.with_prefixlen, None


def ontap_export_clients(nodes, clients=None, cidrs=None, min_prefix_v4=16, min_prefix_v6=48):
    """{'clients': [...], 'problems': [...]} for the export rule of the shared tier."""
    matches, problems = [], []
    listed = _as_list(clients)
    if listed:
        sources = [("%s item" % LIST_VARIABLE, value) for value in listed]
    else:
        sources = []
        for host, value in (nodes or {}).items():
            sources += [("%s's %s" % (host, NODE_VARIABLE), item) for item in _as_list(value)]
    for where, value in sources:
        match = _host_match(value)
        if match is None:
            problems.append(_node_problem(where, value))
        elif match not in matches:
            matches.append(match)
    for value in _as_list(cidrs):
        match, problem = _cidr_match(value, int(min_prefix_v4), int(min_prefix_v6))
        if problem:
            problems.append(problem)
        elif match not in matches:
            matches.append(match)
    return {"clients": matches, "problems": problems}


class FilterModule(object):
    """kvcache.offload ONTAP export filters."""

    def filters(self):
        return {"ontap_export_clients": ontap_export_clients}

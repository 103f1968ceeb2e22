# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""internal_address: the address a host's internal services listen on; url_host: how to reach it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: internal_address
short_description: The address a host's internal ports (engine API, metrics, router admin) bind to
version_added: 0.1.0
description:
  - Returns the input when it is an IPv4 or IPv6 address literal, normally the host's
    C(ansible_host), the address the rest of the fleet (router backends, Prometheus targets)
    already uses to reach the host.
  - Otherwise (an inventory name or a DNS name) returns the address of the host's default-route
    interface from the gathered facts (C(default_ipv4), then C(default_ipv6)).
  - Returns an empty string when neither is known, so the role's input check can fail with a
    message that names the host and the variable to set. It never falls back to every interface
    (C(0.0.0.0)), since listening everywhere is something an operator asks for explicitly.
  - The same file has C(kvcache.offload.url_host), the host part of a URL to a service bound to
    an address, asked from the same host. It gives C(127.0.0.1) for a wildcard or empty address and
    brackets an IPv6 address.
positional: facts
options:
  _input:
    description: The host's inventory address, usually C(ansible_host | default('')).
    type: str
    required: true
  facts:
    description: The host's C(ansible_facts) (only C(default_ipv4) and C(default_ipv6) are read).
    type: dict
    default: {}
"""

EXAMPLES = r"""
# roles/vllm/defaults/main.yml
vllm_bind_address: "{{ ansible_host | default('') | kvcache.offload.internal_address(ansible_facts) }}"
# ansible_host=10.0.0.11          -> "10.0.0.11"
# ansible_host=gpu1.example.com   -> the default_ipv4 address fact, e.g. "10.0.0.11"
"""

RETURN = r"""
_value:
  description: An IP address literal, or an empty string when none can be derived.
  type: str
"""

import ipaddress
from collections.abc import Mapping


def is_ip_address(value):
    """True for an IPv4 or IPv6 address literal (no brackets, no port)."""
    try:
        ipaddress.ip_address(str(value).strip())
    except ValueError:
        return False
    return True


def url_host(value):
    """The host part of a URL to a service bound to value, asked from the same host.

    A wildcard or empty bind address is reached on the loopback; an IPv6 address gets brackets.
    """
    value = "" if value is None else str(value).strip()
    if value in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    if ":" in value and not value.startswith("["):
        return "[%s]" % value
    return value


def internal_address(value, facts=None):
    """The IP literal in value, else the default-route address from facts, else ''."""
    value = "" if value is None else str(value).strip()
    if is_ip_address(value):
        return value
    facts = facts if isinstance(facts, Mapping) else {}
    for key in ("default_ipv4", "default_ipv6"):
        route = facts.get(key)
        if isinstance(route, Mapping) and is_ip_address(route.get("address", "")):
            return str(route["address"])
    return ""


class FilterModule(object):
    """kvcache.offload address filters."""

    def filters(self):
        return {"internal_address": internal_address, "url_host": url_host}

# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_settings: a router host's router_* settings, its own or the router role's defaults."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: router_settings
short_description: The router_* settings of a router host, with the router role's defaults
version_added: 0.1.0
description:
  - Plays and roles other than the router role (the rolling upgrade, the validation) need the
    router's port, implementation and backend scheme, but the router role's defaults are not in
    C(hostvars) unless the router role runs in the same play.
  - Returns every literal default of the router role (C(roles/router/defaults/main.yml), read
    from the collection itself, so the fallback is written in one place), overlaid with the
    host's own C(router_*) variables (inventory, host_vars, group_vars, facts).
  - Defaults that are templates (C(router_host), C(router_metrics_host), C(router_api_key)) are
    left out unless the host sets them; the caller derives them.
positional: host
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  host:
    description: Inventory name of the router host; empty or unknown gives the defaults alone.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The router's URL from the first host of kvcache_router
  ansible.builtin.set_fact:
    router_url: >-
      http://{{ hostvars[groups['kvcache_router'][0]].ansible_host }}:{{
      (hostvars | kvcache.offload.router_settings(groups['kvcache_router'][0])).router_port }}
"""

RETURN = r"""
_value:
  description: C(router_*) variable name -> value (the host's own where set, else the router role's default).
  type: dict
"""

import functools
import os

import yaml

ROUTER_DEFAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                               "roles", "router", "defaults", "main.yml")


@functools.lru_cache(maxsize=None)
def _defaults(path=ROUTER_DEFAULTS):
    """The router role's literal defaults (templates left out)."""
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    return {key: value for key, value in data.items()
            if key.startswith("router_") and not (isinstance(value, str) and "{{" in value)}


def router_defaults():
    """A copy of the router role's literal defaults."""
    return dict(_defaults())


def router_settings(hostvars, host):
    """router_* settings of host: its own values, else the router role's literal defaults."""
    settings = router_defaults()
    if not host:
        return settings
    try:
        hvars = hostvars[host]
    except KeyError:
        return settings
    for key in set(settings) | {k for k in _keys(hvars) if k.startswith("router_")}:
        try:
            value = hvars.get(key)
        except Exception:  # pylint: disable=broad-except
            value = None
        if value is not None:
            settings[key] = value
    return settings


def _keys(hvars):
    try:
        return list(hvars.keys())
    except Exception:  # pylint: disable=broad-except
        return []


class FilterModule(object):
    def filters(self):
        return {"router_settings": router_settings}

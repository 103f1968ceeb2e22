# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one node runs, as the controller computes it from another host's hostvars (issue #36).

hostvars hold a host's inventory values and facts, never role defaults: a reader on another host
(the router's checks, the monitoring's scrape targets) that takes a value missing from a node's
hostvars must apply the fleet default the way roles/kvcache derives it, or it reads its own host's
value instead (the router's kvaware check once took the router's multiprocess mode for GDS nodes).
The rules here are the roles' own derivations, written once; tests/unit/plugins/module_utils/test_node_plan.py
renders the roles' YAML defaults for the same inputs and fails when the two disagree.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import os

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import host_value

ROLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "roles")
KVCACHE_DEFAULTS = os.path.join(ROLES, "kvcache", "defaults", "main.yml")
LMCACHE_MODES = ("multiprocess", "inprocess")


@functools.lru_cache(maxsize=None)
def fleet_defaults(path=KVCACHE_DEFAULTS):
    """roles/kvcache's literal defaults (templated ones left out): the one place they are written."""
    import yaml  # controller side only
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    return {key: value for key, value in data.items() if not (isinstance(value, str) and "{{" in value)}


def role_defaults(role):
    """Another role's literal defaults, read from its defaults file the same way."""
    return fleet_defaults(os.path.join(ROLES, role, "defaults", "main.yml"))


def fleet_value(hvars, key):
    """The host's value of a fleet setting, else roles/kvcache's literal default (None if it has none)."""
    value = host_value(hvars, key)
    return fleet_defaults().get(key) if value is None else value


def fleet_flag(host, hvars, key):
    """A fleet boolean (the host's value, else roles/kvcache's default; unset is false)."""
    value = fleet_value(hvars, key)
    try:
        return boolean(value, strict=True) if value is not None else False
    except TypeError:
        raise ValueError("host %s: %s is %r, not a boolean. Fix: set %s to true or false." % (host, key, value, key))


def lmcache_mode(host, hvars, fallback=None):
    """The node's LMCache mode: its kvcache_lmcache_mode, else roles/kvcache's derivation (inprocess
    for the GDS tier, kvcache_fs_gds, else multiprocess). fallback, when given, replaces the
    derivation's multiprocess for a node that sets neither (a caller's own default)."""
    mode = host_value(hvars, "kvcache_lmcache_mode")
    if mode is None:
        mode = "inprocess" if fleet_flag(host, hvars, "kvcache_fs_gds") else (fallback or "multiprocess")
    if mode not in LMCACHE_MODES:
        raise ValueError("host %s: kvcache_lmcache_mode is %r. Fix: set kvcache_lmcache_mode to one of %s."
                         % (host, mode, ", ".join(LMCACHE_MODES)))
    return mode


def _fleet_port(host, hvars, flag, key):
    """The port of a node service a fleet boolean turns on, or None when it is off."""
    if not fleet_flag(host, hvars, flag):
        return None
    port = fleet_value(hvars, key)
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = 0
    if isinstance(port, bool) or not 1 <= number <= 65535:
        raise ValueError("host %s: %s is %r. Fix: set it to a port 1-65535." % (host, key, port))
    return number


def dcgm_exporter_port(host, hvars):
    """The port of the node's DCGM exporter (kvcache_dcgm_exporter, kvcache_dcgm_exporter_port, fleet
    defaults), or None when the fleet runs none."""
    return _fleet_port(host, hvars, "kvcache_dcgm_exporter", "kvcache_dcgm_exporter_port")


def metrics_proxy_port(host, hvars):
    """The port of the node's metrics proxy (kvcache_metrics_proxy, kvcache_metrics_proxy_port, fleet
    defaults), or None when the fleet runs none."""
    return _fleet_port(host, hvars, "kvcache_metrics_proxy", "kvcache_metrics_proxy_port")


def prune_active(host, hvars):
    """Whether the node runs the fs tier's pruner, by roles/kvcache_prune's rule (vars/main.yml): the fs
    tier, and kvcache_prune_scope all, or the node first in kvcache_prune_fleet_group (or that group
    empty); what the host does not set comes from kvcache_prune's defaults."""
    prune_defaults = role_defaults("kvcache_prune")
    if fleet_value(hvars, "kvcache_tier") != "fs":
        return False
    scope = host_value(hvars, "kvcache_prune_scope") or prune_defaults.get("kvcache_prune_scope", "first")
    if scope == "all":
        return True
    group = host_value(hvars, "kvcache_prune_fleet_group") or prune_defaults.get("kvcache_prune_fleet_group", "kvcache_nodes")
    try:
        members = list((hvars.get("groups") or {}).get(group) or [])
    except Exception:  # pylint: disable=broad-except
        members = []
    return not members or members[0] == host

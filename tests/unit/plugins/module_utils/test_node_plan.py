# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/node_plan.py derives a node's settings from its hostvars exactly as the roles'
YAML defaults do on the node: rendered side by side for the same inventory, they agree."""

from __future__ import absolute_import, division, print_function

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.kvcache.offload.plugins.filter.node_lmcache_mode import node_lmcache_mode
from ansible_collections.kvcache.offload.plugins.module_utils.node_plan import fleet_defaults, lmcache_mode

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
INVENTORIES = [{}, {"kvcache_tier": "s3"}, {"kvcache_fs_gds": True}, {"kvcache_fs_gds": "yes"}, {"kvcache_fs_gds": False},
               {"kvcache_lmcache_mode": "inprocess"}, {"kvcache_fs_gds": True, "kvcache_lmcache_mode": "multiprocess"},
               {"kvcache_lmcache_mode": ""}]


def rendered_on_the_node(**inventory):
    with open(os.path.join(ROOT, "roles", "kvcache", "defaults", "main.yml"), encoding="utf-8") as handle:
        variables = yaml.safe_load(handle)
    variables.update({k: v for k, v in inventory.items() if v != ""})
    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template("{{ kvcache_lmcache_mode }}"))


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[str(i) for i in INVENTORIES])
def test_the_mode_read_from_hostvars_is_the_mode_the_node_derives(inventory):
    assert lmcache_mode("gpu-a01", inventory) == rendered_on_the_node(**inventory)


def test_a_fallback_replaces_only_the_derived_multiprocess():
    assert lmcache_mode("n", {}, "inprocess") == "inprocess"
    assert lmcache_mode("n", {"kvcache_fs_gds": True}, "multiprocess") == "inprocess"
    assert lmcache_mode("n", {"kvcache_lmcache_mode": "multiprocess"}, "inprocess") == "multiprocess"


@pytest.mark.parametrize("hvars, words", [
    ({"kvcache_lmcache_mode": "in-process"}, ["host gpu-a01", "kvcache_lmcache_mode is 'in-process'", "Fix:"]),
    ({"kvcache_fs_gds": "maybe"}, ["host gpu-a01", "kvcache_fs_gds is 'maybe'", "Fix:"]),
])
def test_bad_values_name_the_host_the_variable_and_the_fix(hvars, words):
    with pytest.raises(ValueError) as error:
        lmcache_mode("gpu-a01", hvars)
    for word in words:
        assert word in str(error.value)


def test_the_fleet_defaults_are_roles_kvcaches_literal_ones():
    defaults = fleet_defaults()
    assert defaults["kvcache_fs_gds"] is False and defaults["kvcache_tier"] == "fs"
    assert "kvcache_lmcache_mode" not in defaults  # templated: derived, not read


def test_the_filter_reads_the_nodes_own_hostvars():
    hostvars = {"gpu-a01": {"kvcache_fs_gds": True}, "gpu-a02": {}, "router-1": {"kvcache_lmcache_mode": "multiprocess"}}
    assert [node_lmcache_mode(h, hostvars) for h in ("gpu-a01", "gpu-a02")] == ["inprocess", "multiprocess"]
    with pytest.raises(Exception) as error:
        node_lmcache_mode("gpu-z9", hostvars)
    assert "gpu-z9 is not in the inventory" in str(error.value)

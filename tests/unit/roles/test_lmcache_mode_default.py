# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue #21 item 3: LMCache's multiprocess mode is the default (evidence:
docs/notes/lmcache-mode-evidence.md), derived by roles/kvcache so that the GDS tier, whose
LMCache backend runs inside the engine, stays in-process. Rendered by Ansible's templating from
the role's own defaults; the shipped inventories take the derived value (they set no mode)."""

from __future__ import absolute_import, division, print_function

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def mode(**inventory):
    variables = dict(load("roles/kvcache/defaults/main.yml"), **inventory)
    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template("{{ kvcache_lmcache_mode }}"))


@pytest.mark.parametrize("inventory,expected", [
    ({}, "multiprocess"),
    ({"kvcache_tier": "s3"}, "multiprocess"),
    ({"kvcache_fs_gds": True}, "inprocess"),
    ({"kvcache_fs_gds": "yes"}, "inprocess"),
    ({"kvcache_fs_gds": False}, "multiprocess"),
    # an explicit choice wins over the derivation
    ({"kvcache_lmcache_mode": "inprocess"}, "inprocess"),
])
def test_the_default_mode_is_multiprocess_but_for_gds(inventory, expected):
    assert mode(**inventory) == expected


def test_the_argument_spec_documents_the_derived_default():
    spec = load("roles/kvcache/meta/argument_specs.yml")["argument_specs"]["main"]["options"]["kvcache_lmcache_mode"]
    assert spec["default"] == "multiprocess"
    assert "kvcache_fs_gds" in " ".join(spec["description"])


@pytest.mark.parametrize("inventory", ["example", "lab"])
def test_the_shipped_inventories_take_the_derived_mode(inventory):
    """Neither sets the mode: the lab runs the default (multiprocess) the way production gets it."""
    base = os.path.join(ROOT, "inventories", inventory)
    for folder, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith((".yml", ".yaml")):
                data = load(os.path.join(folder, name)) or {}
                assert "kvcache_lmcache_mode" not in data, os.path.join(folder, name)

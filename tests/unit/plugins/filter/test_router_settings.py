# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests for the router_settings filter (kvcache.offload)."""

from __future__ import absolute_import, division, print_function

import os

import yaml

from ansible_collections.kvcache.offload.plugins.filter.router_settings import FilterModule, router_defaults, router_settings

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml"), encoding="utf-8") as _handle:
    ROLE_DEFAULTS = yaml.safe_load(_handle)


def test_the_defaults_are_the_router_roles_own():
    defaults = router_defaults()
    assert defaults["router_port"] == ROLE_DEFAULTS["router_port"]
    assert defaults["router_implementation"] == ROLE_DEFAULTS["router_implementation"]
    assert defaults["router_backend_scheme"] == ROLE_DEFAULTS["router_backend_scheme"]
    assert defaults["router_metrics_port"] == ROLE_DEFAULTS["router_metrics_port"]
    # Templates cannot be rendered here: the caller derives them.
    assert "router_host" not in defaults and "router_api_key" not in defaults
    defaults["router_port"] = 1
    assert router_defaults()["router_port"] == ROLE_DEFAULTS["router_port"]


def test_the_hosts_own_values_win():
    hostvars = {"r1": {"ansible_host": "10.0.0.10", "router_port": 9001, "router_implementation": "vllm_router",
                       "router_host": "10.0.0.10", "router_extra": "x"}}
    settings = router_settings(hostvars, "r1")
    assert settings["router_port"] == 9001
    assert settings["router_implementation"] == "vllm_router"
    assert settings["router_host"] == "10.0.0.10"
    assert settings["router_extra"] == "x"
    assert "ansible_host" not in settings
    assert settings["router_backend_scheme"] == ROLE_DEFAULTS["router_backend_scheme"]


def test_a_host_without_router_variables_gets_the_defaults():
    assert router_settings({"r1": {"ansible_host": "10.0.0.10"}}, "r1") == router_defaults()
    assert router_settings({}, "gone") == router_defaults()
    assert router_settings({}, "") == router_defaults()
    assert router_settings({}, None)["router_port"] == ROLE_DEFAULTS["router_port"]


def test_filter_is_registered():
    assert FilterModule().filters()["router_settings"] is router_settings

# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Public dict variables whose keys are known are typed in meta/argument_specs.yml (#18 item 4),
so ansible-core's role argument validation (the same ArgumentSpecValidator, run at the entry
point) refuses a wrong value or a misspelt key; container_runtime's `checks` entry point, which
playbooks/preflight.yml runs before any host changes, has the same options.

Free-form dicts stay untyped only where their keys are not ours to know (listed below, each
with its reason)."""

from __future__ import absolute_import, division, print_function

import glob
import os

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# dict variables without options, and why their keys cannot be listed.
FREE_FORM = {
    ("gds", "gds_cufile_extra"): "any cufile.json key (NVIDIA's schema), merged over the rendered file",
    ("lmcache", "lmcache_extra_config"): "LMCache's own keys, typed by the checks against LMCache's table",
    ("preflight", "preflight_supported_os"): "keys are distribution names, values version lists",
    ("vllm", "vllm_instances.env"): "environment variables (names are the user's)",
    ("vllm", "vllm_extra_env"): "environment variables (names are the user's)",
}


def spec(role, entry="main"):
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        return yaml.safe_load(handle)["argument_specs"][entry]["options"]


def role_defaults(role):
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        return yaml.safe_load(handle)


def validate(role, params, entry="main"):
    """Error messages of ansible-core's validation of params against the role's entry point."""
    result = ArgumentSpecValidator(spec(role, entry)).validate(params)
    return [str(e) for e in result.errors]


def untyped_dicts():
    found = set()
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "meta", "argument_specs.yml")):
        role = path.split(os.sep)[-3]
        with open(path) as handle:
            entries = yaml.safe_load(handle)["argument_specs"]

        def walk(options, prefix):
            for name, option in (options or {}).items():
                if option.get("type") == "dict" and not option.get("options"):
                    found.add((role, prefix + name))
                walk(option.get("options"), prefix + name + ".")
        for entry in entries.values():
            walk(entry.get("options"), "")
    return found


def test_every_untyped_dict_is_free_form_for_a_stated_reason():
    """container_runtime_docker_daemon_options and observability_target_defaults are typed now;
    a new untyped dict must be typed or added to FREE_FORM with its reason. Nested free-form
    objects of daemon.json (log-opts, runtimes, ...) are Docker's to define."""
    nested_docker = {k for k in untyped_dicts() if k[0] == "container_runtime"}
    assert all(k[1].startswith("container_runtime_docker_daemon_options.") for k in nested_docker), nested_docker
    assert untyped_dicts() - nested_docker == set(FREE_FORM)


@pytest.mark.parametrize("entry", ["main", "checks"])
def test_docker_daemon_options_defaults_pass(entry):
    assert validate("container_runtime", {"container_runtime_docker_daemon_options":
                                          role_defaults("container_runtime")["container_runtime_docker_daemon_options"]},
                    entry) == []


@pytest.mark.parametrize("options, fragment", [
    ({"live-restore": "maybe"}, "live-restore"),
    ({"mtu": "auto"}, "mtu"),
    ({"log-driverr": "json-file"}, "log-driverr"),
    ({"default-address-pools": [{"base": "10.10.0.0/16"}]}, "size"),
    ({"registry-mirrors": {"a": 1}}, "registry-mirrors"),
    ({"log-opts": ["max-size", "100m"]}, "log-opts"),
])
@pytest.mark.parametrize("entry", ["main", "checks"])
def test_docker_daemon_options_bad_values_are_refused(options, fragment, entry):
    errors = validate("container_runtime", {"container_runtime_docker_daemon_options": options}, entry)
    assert errors and fragment in " ".join(errors), errors


def test_docker_daemon_options_documented_keys_pass():
    good = {"live-restore": True, "mtu": 1450, "registry-mirrors": ["https://mirror.example"],
            "default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
            "default-address-pools": [{"base": "10.10.0.0/16", "size": 24}], "exec-opts": ["native.cgroupdriver=systemd"],
            "features": {"cdi": True}, "data-root": "/var/lib/docker", "proxies": {"https-proxy": "http://proxy:3128"}}
    assert validate("container_runtime", {"container_runtime_docker_daemon_options": good}) == []


def test_observability_target_defaults_match_the_owning_roles_and_pass():
    defaults = role_defaults("observability")["observability_target_defaults"]
    assert validate("observability", {"observability_target_defaults": defaults}) == []
    assert spec("observability")["observability_target_defaults"]["default"] == defaults
    # every key the filters read from it is typed
    assert set(spec("observability")["observability_target_defaults"]["options"]) >= set(defaults) | {
        "kvcache_tensor_parallel_size", "vllm_base_port", "router_metrics_host"}


@pytest.mark.parametrize("value, fragment", [
    ({"router_port": "eighty"}, "router_port"),
    ({"kvcache_lmcache_mode": "shared"}, "kvcache_lmcache_mode"),
    ({"router_implementation": "nginx"}, "router_implementation"),
    ({"lmcache_mp_http_prot": 8080}, "lmcache_mp_http_prot"),
    ({"kvcache_tensor_parallel_size": "two"}, "kvcache_tensor_parallel_size"),
])
def test_observability_target_defaults_bad_values_are_refused(value, fragment):
    errors = validate("observability", {"observability_target_defaults": value})
    assert errors and fragment in " ".join(errors), errors

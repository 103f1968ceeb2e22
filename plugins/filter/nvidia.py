# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that choose NVIDIA repositories and packages (logic in module_utils).

nvidia_driver_plan(facts, branch, kernel_modules, source, dkms, nvswitch, driver_version)
    -> dict: error ('' when valid), family, repo, module_stream, pinning_package,
       packages, fabricmanager_package. facts is ansible_facts (distribution,
       distribution_version, architecture).
nvidia_fabricmanager_spec(plan, driver_version) -> package spec of exactly that version.
nvidia_toolkit_plan(facts, channel) -> dict: error, family, repo, packages.
container_engine_packages(facts, engine, docker_source) -> dict: error, packages, service, repo.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kvcache.offload.plugins.module_utils.nvidia_packages import (
    driver_plan,
    engine_packages,
    fabricmanager_spec,
    toolkit_plan,
)


def _facts(facts):
    return (facts.get("distribution"), facts.get("distribution_version"), facts.get("architecture", "x86_64"))


def nvidia_driver_plan(facts, branch="580", kernel_modules="open", source="cuda_repo", dkms=True,
                       nvswitch=False, driver_version=""):
    distribution, version, arch = _facts(facts)
    return driver_plan(distribution, version, arch, str(branch), kernel_modules, source, bool(dkms),
                       bool(nvswitch), str(driver_version or ""))


def nvidia_fabricmanager_spec(plan, driver_version):
    return fabricmanager_spec(plan, driver_version)


def nvidia_toolkit_plan(facts, channel="stable"):
    distribution, version, arch = _facts(facts)
    return toolkit_plan(distribution, version, arch, channel=channel)


def container_engine_packages(facts, engine="docker", docker_source="distribution"):
    distribution, version, arch = _facts(facts)
    return engine_packages(distribution, version, engine, docker_source, arch)


class FilterModule(object):
    def filters(self):
        return {
            "nvidia_driver_plan": nvidia_driver_plan,
            "nvidia_fabricmanager_spec": nvidia_fabricmanager_spec,
            "nvidia_toolkit_plan": nvidia_toolkit_plan,
            "container_engine_packages": container_engine_packages,
        }

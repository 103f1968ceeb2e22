# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that choose NVIDIA repositories and packages (logic in module_utils).

nvidia_driver_plan(facts, branch, kernel_modules, source, dkms, nvswitch, driver_version)
    -> dict: error ('' when valid), family, repo, module_stream, pinning_package,
       packages, fabricmanager_package. facts is ansible_facts (distribution,
       distribution_version, architecture).
nvidia_fabricmanager_spec(plan, driver_version) -> package spec of exactly that version.
nvidia_fabricmanager_plan(plan, mode, gpu_facts, driver_version, installed_version)
    -> dict: wanted, version, spec (Fabric Manager only with NVSwitches in mode auto).
nvidia_epel_plan(plan, mode, dkms_needed, probe, distribution) -> dict: error, action, packages, key_url.
nvidia_secure_boot_plan(plan, probe, install_needed, dkms, modules_signed) -> dict: error, state, refused.
nvidia_apt_source_plan(plan, probe) -> dict: error, reuse ({file, signed_by} or None), remove_own.
nvidia_toolkit_plan(facts, channel) -> dict: error, family, repo, packages.
container_engine_packages(facts, engine, docker_source) -> dict: error, packages, service, repo.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kvcache.offload.plugins.module_utils.nvidia_packages import (
    apt_source_plan,
    driver_plan,
    engine_packages,
    epel_plan,
    fabricmanager_plan,
    fabricmanager_spec,
    secure_boot_plan,
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


def nvidia_fabricmanager_plan(plan, mode="auto", gpu_facts=None, driver_version="", installed_version=""):
    gpu_facts = gpu_facts or {}
    return fabricmanager_plan(plan, mode, bool(gpu_facts.get("nvswitch")), str(driver_version or ""),
                              str(installed_version or ""), str(gpu_facts.get("driver_version") or ""))


def nvidia_epel_plan(plan, mode="check", dkms_needed=True, probe="", distribution=""):
    return epel_plan(plan, mode, bool(dkms_needed), probe or "", distribution or "")


def nvidia_secure_boot_plan(plan, probe="", install_needed=True, dkms=True, modules_signed=False):
    return secure_boot_plan(plan, probe or "", bool(install_needed), bool(dkms), bool(modules_signed))


def nvidia_apt_source_plan(plan, probe=""):
    return apt_source_plan(plan, probe or "")


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
            "nvidia_fabricmanager_plan": nvidia_fabricmanager_plan,
            "nvidia_epel_plan": nvidia_epel_plan,
            "nvidia_secure_boot_plan": nvidia_secure_boot_plan,
            "nvidia_apt_source_plan": nvidia_apt_source_plan,
            "nvidia_toolkit_plan": nvidia_toolkit_plan,
            "container_engine_packages": container_engine_packages,
        }

# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which NVIDIA repository and packages a host needs: pure functions, unit tested.

The nvidia_driver and container_runtime roles call these through the filters in
plugins/filter/nvidia.py, so the Ubuntu and RHEL paths (which no image here can run)
are tested as plain Python. Every function returns a plan dict with an ``error`` key:
an empty string when the combination is valid, otherwise a sentence saying what is
wrong; the roles turn it into a failure that names host, variable and fix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

CUDA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
# Signing keys of NVIDIA's CUDA repositories (rotated in 2022; the file name is the key id).
CUDA_REPO_KEYS = {"apt": "3bf863cc.pub", "dnf": "D42D0685.pub"}
TOOLKIT_REPO_BASE = "https://nvidia.github.io/libnvidia-container"
TOOLKIT_KEY_URL = TOOLKIT_REPO_BASE + "/gpgkey"

SUPPORTED = {
    ("Ubuntu", "22.04"): ("apt", "ubuntu2204"),
    ("Ubuntu", "24.04"): ("apt", "ubuntu2404"),
    ("Debian", "12"): ("apt", "debian12"),
    ("RedHat", "9"): ("dnf", "rhel9"),
    ("Rocky", "9"): ("dnf", "rhel9"),
}
# NVIDIA driver branch each distribution's own archive ships (distribution source).
DEBIAN_DISTRIBUTION_BRANCH = {"12": "535"}
# Branches from which Ubuntu/Debian packages in NVIDIA's repository drop the branch
# from their names and are locked with nvidia-driver-pinning-<branch> instead.
UNVERSIONED_NAMES_FROM = 590
PINNING_PACKAGES_FROM = 580

BRANCH_RE = re.compile(r"^[0-9]{3}$")
VERSION_RE = re.compile(r"^([0-9]{3})\.[0-9]+(\.[0-9]+)?$")
CUDA_ARCH = {"x86_64": ("x86_64", "amd64"), "aarch64": ("sbsa", "arm64")}


def _platform(distribution, version):
    major = str(version).split(".", maxsplit=1)[0]
    if distribution == "Ubuntu":
        key = (distribution, ".".join(str(version).split(".")[:2]))
    else:
        key = (distribution, major)
    return SUPPORTED.get(key), major


def validate_branch(branch, version=""):
    """Return an error sentence for a malformed branch/version pair, or ''."""
    branch = str(branch)
    if not BRANCH_RE.match(branch):
        return ("nvidia_driver_branch is %r; expected a three-digit driver branch such as "
                "'580' (the major number of the driver version)" % branch)
    if version:
        match = VERSION_RE.match(str(version))
        if not match:
            return ("nvidia_driver_version is %r; expected a full driver version such as "
                    "'%s.95.05', or an empty string for the newest of the branch" % (version, branch))
        if match.group(1) != branch:
            return ("nvidia_driver_version %s is not on nvidia_driver_branch %s" % (version, branch))
    return ""


def driver_plan(distribution, version, architecture="x86_64", branch="580", kernel_modules="open",
                source="cuda_repo", dkms=True, nvswitch=False, driver_version=""):
    """Repository, packages and Fabric Manager package for one host."""
    plan = {
        "error": "",
        "family": None,
        "repo": None,
        "module_stream": None,
        "pinning_package": None,
        "packages": [],
        "fabricmanager_package": None,
        "fabricmanager_spec": None,
        "persistenced_service": "nvidia-persistenced",
        "fabricmanager_service": "nvidia-fabricmanager",
    }
    platform, major = _platform(distribution, version)
    if platform is None:
        plan["error"] = ("%s %s is not supported by the nvidia_driver role (Ubuntu 22.04/24.04, "
                         "Debian 12, RHEL/Rocky 9)" % (distribution, version))
        return plan
    family, repo_dir = platform
    plan["family"] = family
    error = validate_branch(branch, driver_version)
    if error:
        plan["error"] = error
        return plan
    if kernel_modules not in ("open", "proprietary"):
        plan["error"] = "nvidia_driver_kernel_modules is %r; expected 'open' or 'proprietary'" % kernel_modules
        return plan
    if architecture not in CUDA_ARCH:
        plan["error"] = "CPU architecture %s is not supported (x86_64, aarch64)" % architecture
        return plan
    b = int(branch)
    is_open = kernel_modules == "open"

    if source == "cuda_repo":
        repo_arch, deb_arch = CUDA_ARCH[architecture]
        url = "%s/%s/%s/" % (CUDA_REPO_BASE, repo_dir, repo_arch)
        plan["repo"] = {
            "name": "nvidia-cuda",
            "url": url,
            "key_url": url + CUDA_REPO_KEYS[family],
            "keyring": "/etc/apt/keyrings/nvidia-cuda.asc" if family == "apt" else None,
            "suites": "/",
            "architectures": deb_arch,
        }
        if family == "apt":
            if not dkms:
                plan["error"] = ("NVIDIA's repository builds the kernel module with DKMS on %s; "
                                 "nvidia_driver_dkms: false needs nvidia_driver_source: distribution"
                                 % distribution)
                return plan
            versioned = b < UNVERSIONED_NAMES_FROM and distribution == "Ubuntu"
            if distribution == "Debian" and b < PINNING_PACKAGES_FROM:
                plan["error"] = ("on Debian, NVIDIA's repository can hold a host on a branch only from "
                                 "%d on (nvidia-driver-pinning-<branch>); branch %s needs "
                                 "nvidia_driver_branch >= %d or nvidia_driver_source: distribution"
                                 % (PINNING_PACKAGES_FROM, branch, PINNING_PACKAGES_FROM))
                return plan
            if not versioned:
                plan["pinning_package"] = "nvidia-driver-pinning-%s" % branch
            meta = "nvidia-open" if is_open else "cuda-drivers"
            meta = "%s-%s" % (meta, branch) if versioned else meta
            plan["packages"] = [meta + ("=%s-*" % driver_version if driver_version else "")]
            fm = "nvidia-fabricmanager-%s" % branch if b < UNVERSIONED_NAMES_FROM else "nvidia-fabricmanager"
            plan["fabricmanager_package"] = fm
        else:
            if is_open and not dkms:
                plan["error"] = ("open kernel modules from NVIDIA's RHEL 9 repository are built with DKMS; "
                                 "set nvidia_driver_dkms: true, or nvidia_driver_kernel_modules: proprietary "
                                 "for precompiled modules")
                return plan
            if driver_version:
                plan["error"] = ("on %s the dnf module stream holds the host on a branch; an exact "
                                 "nvidia_driver_version is supported on apt distributions only: leave it "
                                 "empty" % distribution)
                return plan
            stream = branch + ("-open" if is_open else ("-dkms" if dkms else ""))
            plan["module_stream"] = "nvidia-driver:%s" % stream
            plan["packages"] = ["@nvidia-driver:%s/default" % stream]
            plan["fabricmanager_package"] = "nvidia-fabric-manager"
    elif source == "distribution":
        if family == "dnf":
            plan["error"] = ("%s 9 has no NVIDIA driver in its own repositories; use "
                             "nvidia_driver_source: cuda_repo" % distribution)
            return plan
        if driver_version:
            plan["error"] = ("the distribution's packages follow its own updates; an exact "
                             "nvidia_driver_version needs nvidia_driver_source: cuda_repo")
            return plan
        if distribution == "Ubuntu":
            flavour = "%s-server%s" % (branch, "-open" if is_open else "")
            if dkms:
                plan["packages"] = ["nvidia-headless-%s" % flavour, "nvidia-utils-%s-server" % branch]
            else:
                plan["packages"] = ["linux-modules-nvidia-%s-generic" % flavour,
                                    "nvidia-headless-no-dkms-%s" % flavour,
                                    "nvidia-utils-%s-server" % branch]
            plan["fabricmanager_package"] = "nvidia-fabricmanager-%s" % branch
        else:
            shipped = DEBIAN_DISTRIBUTION_BRANCH.get(major)
            if branch != shipped:
                plan["error"] = ("Debian %s ships NVIDIA driver branch %s (non-free), not %s; set "
                                 "nvidia_driver_branch: '%s' or nvidia_driver_source: cuda_repo"
                                 % (major, shipped, branch, shipped))
                return plan
            if not dkms:
                plan["error"] = "Debian builds the NVIDIA kernel module with DKMS only; set nvidia_driver_dkms: true"
                return plan
            kmod = "nvidia-open-kernel-dkms" if is_open else "nvidia-kernel-dkms"
            plan["packages"] = [kmod, "nvidia-smi", "nvidia-persistenced", "libcuda1"]
            if nvswitch:
                plan["error"] = ("this host has NVSwitches and needs Fabric Manager, which Debian does not "
                                 "package; use nvidia_driver_source: cuda_repo")
                return plan
    else:
        plan["error"] = "nvidia_driver_source is %r; expected 'cuda_repo' or 'distribution'" % source
        return plan
    return plan


def fabricmanager_spec(plan, driver_version):
    """Package spec that installs Fabric Manager of exactly this driver version."""
    if not plan.get("fabricmanager_package") or not driver_version:
        return None
    if plan.get("family") == "dnf":
        return "%s-%s" % (plan["fabricmanager_package"], driver_version)
    return "%s=%s-*" % (plan["fabricmanager_package"], driver_version)


def toolkit_plan(distribution, version, architecture="x86_64", engine="docker", channel="stable"):
    """Repository and packages for the NVIDIA Container Toolkit."""
    plan = {"error": "", "family": None, "repo": None, "packages": ["nvidia-container-toolkit"]}
    platform, _major = _platform(distribution, version)
    if platform is None:
        plan["error"] = "%s %s is not supported by the container_runtime role" % (distribution, version)
        return plan
    family = platform[0]
    plan["family"] = family
    if architecture not in CUDA_ARCH:
        plan["error"] = "CPU architecture %s is not supported (x86_64, aarch64)" % architecture
        return plan
    if channel not in ("stable", "experimental"):
        plan["error"] = "container_runtime_nvidia_toolkit_channel is %r; expected stable or experimental" % channel
        return plan
    if family == "apt":
        deb_arch = CUDA_ARCH[architecture][1]
        plan["repo"] = {
            "name": "nvidia-container-toolkit",
            "url": "%s/%s/deb/%s" % (TOOLKIT_REPO_BASE, channel, deb_arch),
            "key_url": TOOLKIT_KEY_URL,
            "keyring": "/etc/apt/keyrings/nvidia-container-toolkit.asc",
            "suites": "/",
        }
    else:
        plan["repo"] = {
            "name": "nvidia-container-toolkit",
            "url": "%s/%s/rpm/$basearch" % (TOOLKIT_REPO_BASE, channel),
            "key_url": TOOLKIT_KEY_URL,
            "keyring": None,
            "suites": None,
        }
    return plan


DOCKER_REPO_BASE = "https://download.docker.com/linux"


def engine_packages(distribution, version, engine="docker", docker_source="distribution", architecture="x86_64"):
    """Container engine packages (and Docker's repository when chosen) for the host."""
    plan = {"error": "", "packages": [], "service": None, "repo": None}
    platform, _major = _platform(distribution, version)
    if platform is None:
        plan["error"] = "%s %s is not supported by the container_runtime role" % (distribution, version)
        return plan
    family = platform[0]
    if engine == "podman":
        plan.update(packages=["podman"], service="podman.socket")
        return plan
    if engine != "docker":
        plan["error"] = "container_runtime_engine is %r; expected docker or podman" % engine
        return plan
    if docker_source == "docker_ce":
        plan.update(packages=["docker-ce", "docker-ce-cli", "containerd.io"], service="docker")
        if family == "apt":
            base = "%s/%s" % (DOCKER_REPO_BASE, distribution.lower())
            plan["repo"] = {"name": "docker", "url": base, "key_url": base + "/gpg",
                            "keyring": "/etc/apt/keyrings/docker.asc", "components": "stable",
                            "architectures": CUDA_ARCH.get(architecture, ("", "amd64"))[1]}
        else:
            base = "%s/rhel" % DOCKER_REPO_BASE
            plan["repo"] = {"name": "docker-ce-stable", "url": base + "/$releasever/$basearch/stable",
                            "key_url": base + "/gpg", "keyring": None, "components": None, "architectures": None}
        return plan
    if docker_source != "distribution":
        plan["error"] = ("container_runtime_docker_source is %r; expected distribution or docker_ce"
                         % docker_source)
        return plan
    if family == "dnf":
        plan["error"] = ("%s 9 does not package Docker; set container_runtime_docker_source: docker_ce "
                         "(Docker's repository) or container_runtime_engine: podman" % distribution)
        return plan
    plan.update(packages=["docker.io"], service="docker")
    return plan

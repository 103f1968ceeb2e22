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


# --- Host preconditions the driver plan depends on (read before any change) -------------
# Each function takes what a read-only probe printed on the host and returns a dict with
# an ``error`` sentence ('' when the host is fine); the role asserts on it before any task
# that changes the host, and preflight runs the same checks on every node first.

EPEL_MODES = ("check", "enable")
EPEL_RELEASE_URL = "https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm"
EPEL_KEY_URL = "https://dl.fedoraproject.org/pub/epel/RPM-GPG-KEY-EPEL-9"


def dkms_source(probe):
    """Where dkms would come from on a dnf host, from the probe tasks/checks.yml runs.

    The probe prints 'installed' when rpm has dkms, else the repository ids
    `dnf repoquery --available dkms` lists (one a line, prefixed 'repo '), else nothing.
    Returns 'installed', the first repository id, or '' (no enabled repository has it).
    """
    for raw in (probe or "").splitlines():
        line = raw.strip()
        if line == "installed":
            return "installed"
        if line.startswith("repo ") and line[5:].strip():
            return line[5:].strip()
    return ""


def epel_plan(plan, mode="check", dkms_needed=True, probe="", distribution=""):
    """What the role does about EPEL on a dnf host that needs dkms.

    action: 'none' (not a dnf host, dkms not needed, or dkms installed/available),
    'enable' (mode enable and no repository has dkms: install EPEL's release package),
    'refuse' (mode check and no repository has dkms). ``packages`` is what to install
    for EPEL; ``key_url`` the key to import first (RHEL; Rocky's extras repo is signed).
    """
    result = {"error": "", "action": "none", "source": "", "packages": [], "key_url": None}
    if mode not in EPEL_MODES:
        result["error"] = "nvidia_driver_epel is %r; expected one of %s" % (mode, ", ".join(EPEL_MODES))
        result["action"] = "refuse"
        return result
    if plan.get("family") != "dnf" or not dkms_needed:
        return result
    source = dkms_source(probe)
    result["source"] = source
    if source:
        return result
    if mode == "enable":
        result["action"] = "enable"
        if distribution == "RedHat":
            result["packages"] = [EPEL_RELEASE_URL]
            result["key_url"] = EPEL_KEY_URL
        else:
            result["packages"] = ["epel-release"]
        return result
    result["action"] = "refuse"
    result["error"] = (
        "the driver is built with DKMS (nvidia_driver_dkms: true) and dkms comes from EPEL, but no enabled "
        "repository on this host provides dkms (rpm -q dkms and dnf repoquery --available dkms found nothing). "
        "Fix: enable EPEL on the host (%s), or a mirror that carries dkms; or set nvidia_driver_epel: enable "
        "to let the role install EPEL's release package; or set nvidia_driver_dkms: false with "
        "nvidia_driver_kernel_modules: proprietary for NVIDIA's precompiled modules"
        % ("dnf install %s" % EPEL_RELEASE_URL if distribution == "RedHat" else "dnf install epel-release"))
    return result


def secure_boot_state(probe):
    """Secure Boot state from the probe tasks/checks.yml runs.

    The probe prints `mokutil --sb-state` (stdout and stderr) when mokutil exists, else
    'no-mokutil' and then 'no-efi' (no /sys/firmware/efi: legacy BIOS boot) or
    'efivar-secureboot=<byte>' (the SecureBoot EFI variable's value) or 'efivar-unreadable'.
    Returns 'enabled', 'disabled' (includes shim validation disabled, setup mode, firmware
    without Secure Boot, legacy BIOS) or 'unknown'.
    """
    text = probe or ""
    if "SecureBoot validation is disabled in shim" in text:
        return "disabled"
    if "SecureBoot enabled" in text:
        return "enabled"
    if "SecureBoot disabled" in text:
        return "disabled"
    if "doesn't support Secure Boot" in text or "EFI variables are not supported" in text:
        return "disabled"
    match = re.search(r"efivar-secureboot=(\d+)", text)
    if match:
        return "enabled" if match.group(1) == "1" else "disabled"
    if "no-efi" in text:
        return "disabled"
    return "unknown"


def secure_boot_plan(plan, probe="", install_needed=True, dkms=True, modules_signed=False):
    """Refuse installing DKMS-built (unsigned) kernel modules on a host with Secure Boot on.

    DKMS builds the module on the host; with Secure Boot enforcing module signatures the
    kernel refuses it after the reboot ('Key was rejected by service'), which shows only
    then. Precompiled modules from the distribution (Ubuntu, nvidia_driver_dkms: false) are
    signed by Canonical and not refused. nvidia_driver_modules_signed: true says the host
    signs DKMS modules with an enrolled key (MOK).
    """
    state = secure_boot_state(probe)
    result = {"error": "", "state": state, "refused": False}
    builds_with_dkms = bool(dkms) or plan.get("family") == "apt" and plan.get("repo") is not None
    if state != "enabled" or not install_needed or not builds_with_dkms or modules_signed:
        return result
    result["refused"] = True
    result["error"] = (
        "Secure Boot is enabled (mokutil --sb-state: SecureBoot enabled) and the role would install NVIDIA "
        "kernel modules built on the host by DKMS, which are not signed with a key the firmware trusts: the "
        "kernel would refuse to load them after the reboot. Fix: enroll a Machine Owner Key that DKMS signs "
        "with (mokutil --import /var/lib/dkms/mok.pub, or /var/lib/shim-signed/mok/MOK.der on Ubuntu; confirm "
        "the enrolment at the console on the next boot), then set nvidia_driver_modules_signed: true; or use "
        "signed precompiled modules (Ubuntu: nvidia_driver_source: distribution with nvidia_driver_dkms: false); "
        "or turn Secure Boot off in the firmware")
    return result


def _strip_slash(uri):
    return (uri or "").strip().rstrip("/")


def parse_apt_sources(probe):
    """Entries of apt source files as the probe prints them: '==> <path> <==' then the file.

    One-line ('deb [signed-by=...] uri suite ...') and deb822 ('Types:', 'URIs:',
    'Signed-By:', 'Enabled:') formats. Returns a list of dicts: file, uri, signed_by
    ('' when the entry has none; '<inline key>' for a key embedded in the entry).
    """
    entries = []
    files = []
    current = None
    for raw in (probe or "").splitlines():
        match = re.match(r"^==> (.+) <==$", raw.strip())
        if match:
            current = [match.group(1), []]
            files.append(current)
        elif current is not None:
            current[1].append(raw)
    for path, lines in files:
        if path.endswith(".sources"):
            entries.extend(_deb822_entries(path, lines))
        else:
            for raw in lines:
                line = raw.split("#", 1)[0].strip()
                match = re.match(r"^(deb|deb-src)\s+(\[[^\]]*\]\s+)?(\S+)\s+", line + " ")
                if not match:
                    continue
                options = (match.group(2) or "").strip().strip("[]")
                signed_by = ""
                for opt in options.split():
                    key, _sep, value = opt.partition("=")
                    if key.lower() == "signed-by":
                        signed_by = value
                entries.append({"file": path, "uri": match.group(3), "signed_by": signed_by})
    return entries


def _deb822_entries(path, lines):
    stanzas, fields, last = [], {}, None
    for raw in lines + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                stanzas.append(fields)
            fields, last = {}, None
            continue
        if raw[0] in " \t" and last:
            fields[last] += "\n" + raw.strip()
            continue
        key, _sep, value = raw.partition(":")
        last = key.strip().lower()
        fields[last] = value.strip()
    entries = []
    for stanza in stanzas:
        if stanza.get("enabled", "yes").lower() == "no":
            continue
        signed_by = stanza.get("signed-by", "")
        if "BEGIN PGP PUBLIC KEY BLOCK" in signed_by:
            signed_by = "<inline key>"
        for uri in stanza.get("uris", "").split():
            entries.append({"file": path, "uri": uri, "signed_by": signed_by})
    return entries


def apt_source_plan(plan, probe="", own_file="/etc/apt/sources.list.d/nvidia-cuda.sources"):
    """Reuse a CUDA repository source the host already has, or refuse a conflict.

    apt refuses to read its sources ("Conflicting values set for option Signed-By") when
    two entries for the same URI name different keys, which is what adding the role's own
    source next to cuda-keyring's (signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg)
    does. So: when other files already carry NVIDIA's repository URI with one key, the role
    reuses that source (no key download, no source of its own; its own file from an earlier
    run is removed, ``remove_own``). When they disagree among themselves, the role refuses
    and names the files to remove.
    """
    result = {"error": "", "reuse": None, "remove_own": False}
    if plan.get("family") != "apt" or not plan.get("repo"):
        return result
    wanted = _strip_slash(plan["repo"]["url"])
    entries = [e for e in parse_apt_sources(probe) if _strip_slash(e["uri"]) == wanted]
    own = [e for e in entries if e["file"] == own_file]
    others = [e for e in entries if e["file"] != own_file]
    if not others:
        return result
    keys = sorted(set(e["signed_by"] for e in others))
    if len(keys) > 1:
        described = "; ".join("%s (Signed-By %s)" % (e["file"], e["signed_by"] or "none: apt's global keyring")
                              for e in others)
        result["error"] = (
            "apt already has NVIDIA's CUDA repository %s in several files with different keys: %s. apt refuses "
            "such sources (Conflicting values set for option Signed-By), so the role cannot add or reuse one. "
            "Fix: keep one of these files and remove the others (cuda-keyring's "
            "/etc/apt/sources.list.d/cuda-*.list is the one NVIDIA's cuda-keyring package maintains), then run "
            "apt-get update" % (plan["repo"]["url"], described))
        return result
    result["reuse"] = {"file": others[0]["file"], "signed_by": keys[0]}
    result["remove_own"] = bool(own)
    return result


def fabricmanager_plan(plan, mode="auto", nvswitch=False, driver_version="", installed_version="",
                       smi_version=""):
    """Whether this host gets Fabric Manager and the package spec of exactly the driver's version.

    Wanted with mode 'always', or 'auto' on a host with NVSwitches (gpu_facts.nvswitch);
    never on a PCIe host in 'auto'. The version is nvidia_driver_version when pinned, else
    the installed kernel module's (modinfo), else what nvidia-smi reports. ``spec`` is None
    when FM is not wanted or the version is unknown (the role then refuses outside check mode).
    """
    wanted = mode == "always" or (mode == "auto" and bool(nvswitch))
    version = driver_version or installed_version or smi_version or ""
    return {
        "wanted": wanted,
        "version": version if wanted else "",
        "spec": fabricmanager_spec(plan, version) if wanted else None,
    }

"""Host preconditions of the nvidia_driver role (issue #18): EPEL for dkms on RHEL 9,
Secure Boot before DKMS modules, an apt source of NVIDIA's repository the host already
has, and Fabric Manager only on NVSwitch hosts, pinned to the driver's version. The
refusals are asserted on their sentences, since the role prints them as they are."""
import os

import pytest

from ansible_collections.kvcache.offload.plugins.filter import nvidia as flt
from ansible_collections.kvcache.offload.plugins.module_utils import nvidia_smi as smi

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
UBUNTU22 = {"distribution": "Ubuntu", "distribution_version": "22.04", "architecture": "x86_64"}
UBUNTU24 = {"distribution": "Ubuntu", "distribution_version": "24.04", "architecture": "x86_64"}
DEBIAN12 = {"distribution": "Debian", "distribution_version": "12.11", "architecture": "x86_64"}
RHEL9 = {"distribution": "RedHat", "distribution_version": "9.6", "architecture": "x86_64"}
ROCKY9 = {"distribution": "Rocky", "distribution_version": "9.5", "architecture": "x86_64"}


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts)) as handle:
        return handle.read()


def sources_probe(*names):
    """What the role's probe prints: each file that names NVIDIA's repository, with a header."""
    return "".join("==> /etc/apt/sources.list.d/%s <==\n%s" % (name, fixture("apt_sources", name))
                   for name in names)


def test_new_filters_are_registered():
    assert {"nvidia_fabricmanager_plan", "nvidia_epel_plan", "nvidia_secure_boot_plan",
            "nvidia_apt_source_plan"} <= set(flt.FilterModule().filters())


# --- EPEL (dkms on RHEL 9) ---------------------------------------------------------------

@pytest.mark.parametrize("facts", [RHEL9, ROCKY9])
def test_epel_refused_before_any_change_when_no_repository_has_dkms(facts):
    plan = flt.nvidia_driver_plan(facts, branch="580")
    result = flt.nvidia_epel_plan(plan, "check", True, "", facts["distribution"])
    assert result["action"] == "refuse"
    for needle in ("dkms", "EPEL", "nvidia_driver_epel: enable", "nvidia_driver_dkms: false", "Fix:"):
        assert needle in result["error"]
    wanted = "epel-release-latest-9" if facts["distribution"] == "RedHat" else "dnf install epel-release"
    assert wanted in result["error"]


@pytest.mark.parametrize("probe,source", [
    ("installed\n", "installed"),
    ("repo epel\n", "epel"),
    ("repo satellite-epel9-x86_64\nrepo epel\n", "satellite-epel9-x86_64"),
])
def test_epel_not_needed_when_dkms_is_installed_or_available(probe, source):
    plan = flt.nvidia_driver_plan(RHEL9, branch="580")
    result = flt.nvidia_epel_plan(plan, "check", True, probe, "RedHat")
    assert result == {"error": "", "action": "none", "source": source, "packages": [], "key_url": None}


def test_epel_enable_installs_the_release_package():
    rhel = flt.nvidia_epel_plan(flt.nvidia_driver_plan(RHEL9), "enable", True, "", "RedHat")
    assert rhel["action"] == "enable" and rhel["error"] == ""
    assert rhel["packages"] == ["https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm"]
    assert rhel["key_url"] == "https://dl.fedoraproject.org/pub/epel/RPM-GPG-KEY-EPEL-9"
    rocky = flt.nvidia_epel_plan(flt.nvidia_driver_plan(ROCKY9), "enable", True, "", "Rocky")
    assert rocky["packages"] == ["epel-release"] and rocky["key_url"] is None


def test_epel_ignored_where_dkms_is_not_needed():
    dnf = flt.nvidia_driver_plan(RHEL9)
    assert flt.nvidia_epel_plan(dnf, "check", False, "", "RedHat")["action"] == "none"
    apt = flt.nvidia_driver_plan(UBUNTU22)
    assert flt.nvidia_epel_plan(apt, "check", True, "", "Ubuntu")["action"] == "none"
    assert "nvidia_driver_epel" in flt.nvidia_epel_plan(dnf, "always", True, "", "RedHat")["error"]


# --- Secure Boot --------------------------------------------------------------------------

@pytest.mark.parametrize("name,state", [
    ("sb_enabled.txt", "enabled"), ("sb_disabled.txt", "disabled"), ("sb_setup_mode.txt", "disabled"),
    ("sb_shim_validation_disabled.txt", "disabled"), ("sb_not_supported.txt", "disabled"),
    ("sb_no_efivars.txt", "disabled"),
])
def test_secure_boot_state_from_mokutil_captures(name, state):
    plan = flt.nvidia_driver_plan(UBUNTU22)
    result = flt.nvidia_secure_boot_plan(plan, fixture("mokutil", name), True, True, False)
    assert result["state"] == state
    assert result["refused"] is (state == "enabled")


@pytest.mark.parametrize("probe,state", [
    ("no-mokutil\nno-efi\n", "disabled"), ("no-mokutil\nefivar-secureboot=1\n", "enabled"),
    ("no-mokutil\nefivar-secureboot=0\n", "disabled"), ("no-mokutil\nefivar-unreadable\n", "unknown"),
])
def test_secure_boot_state_without_mokutil(probe, state):
    assert flt.nvidia_secure_boot_plan(flt.nvidia_driver_plan(DEBIAN12), probe)["state"] == state


def test_secure_boot_refusal_names_the_fixes():
    plan = flt.nvidia_driver_plan(UBUNTU24, branch="580")
    error = flt.nvidia_secure_boot_plan(plan, fixture("mokutil", "sb_enabled.txt"), True, True, False)["error"]
    for needle in ("Secure Boot is enabled", "DKMS", "mokutil --import", "nvidia_driver_modules_signed: true",
                   "nvidia_driver_source: distribution with nvidia_driver_dkms: false", "Fix:"):
        assert needle in error


def test_secure_boot_not_refused_without_a_dkms_install():
    enabled = fixture("mokutil", "sb_enabled.txt")
    apt = flt.nvidia_driver_plan(UBUNTU22)
    # already on the branch: nothing is installed
    assert not flt.nvidia_secure_boot_plan(apt, enabled, False, True, False)["refused"]
    # the operator enrolled the key DKMS signs with
    assert not flt.nvidia_secure_boot_plan(apt, enabled, True, True, True)["refused"]
    # Ubuntu's precompiled modules are signed by Canonical
    signed = flt.nvidia_driver_plan(UBUNTU22, branch="570", source="distribution", dkms=False)
    assert signed["error"] == ""
    assert not flt.nvidia_secure_boot_plan(signed, enabled, True, False, False)["refused"]


# --- apt: NVIDIA's repository already configured (cuda-keyring) -----------------------------

def test_cuda_keyring_source_is_reused():
    plan = flt.nvidia_driver_plan(UBUNTU22, branch="580")
    result = flt.nvidia_apt_source_plan(plan, sources_probe("cuda-ubuntu2204-x86_64.list"))
    assert result == {"error": "", "remove_own": False, "reuse": {
        "file": "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
        "signed_by": "/usr/share/keyrings/cuda-archive-keyring.gpg"}}


def test_own_source_next_to_cuda_keyring_is_removed():
    plan = flt.nvidia_driver_plan(UBUNTU22, branch="580")
    result = flt.nvidia_apt_source_plan(plan, sources_probe("cuda-ubuntu2204-x86_64.list", "nvidia-cuda.sources"))
    assert result["error"] == "" and result["remove_own"] is True
    assert result["reuse"]["file"].endswith("cuda-ubuntu2204-x86_64.list")


def test_conflicting_sources_are_refused_naming_the_files():
    plan = flt.nvidia_driver_plan(DEBIAN12, branch="580")
    result = flt.nvidia_apt_source_plan(plan, sources_probe("cuda-debian12-x86_64.list", "cuda-manual.list"))
    assert result["reuse"] is None
    for needle in ("/etc/apt/sources.list.d/cuda-manual.list", "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",
                   "Conflicting values set for option Signed-By", "remove", "Fix:"):
        assert needle in result["error"]


def test_other_repositories_and_other_distributions_are_not_reused():
    plan = flt.nvidia_driver_plan(UBUNTU24, branch="580")  # ubuntu2404: the 22.04 file is another URI
    assert flt.nvidia_apt_source_plan(plan, sources_probe("cuda-ubuntu2204-x86_64.list")) == {
        "error": "", "reuse": None, "remove_own": False}
    assert flt.nvidia_apt_source_plan(plan, "") == {"error": "", "reuse": None, "remove_own": False}
    dnf = flt.nvidia_driver_plan(RHEL9)
    assert flt.nvidia_apt_source_plan(dnf, sources_probe("cuda-ubuntu2204-x86_64.list"))["reuse"] is None


def test_deb822_sources_disabled_and_inline_keys():
    probe = ("==> /etc/apt/sources.list.d/cuda.sources <==\n"
             "Types: deb\nURIs: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/\n"
             "Suites: /\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n -----END PGP PUBLIC KEY BLOCK-----\n"
             "\nTypes: deb\nURIs: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/\n"
             "Suites: /\nEnabled: no\nSigned-By: /tmp/other.gpg\n")
    plan = flt.nvidia_driver_plan(DEBIAN12, branch="580")
    result = flt.nvidia_apt_source_plan(plan, probe)
    assert result["error"] == ""
    assert result["reuse"] == {"file": "/etc/apt/sources.list.d/cuda.sources", "signed_by": "<inline key>"}


# --- Fabric Manager, from the captures ------------------------------------------------------

def gpu_facts_from(gpu):
    """gpu_facts as the module builds them from nvidia-smi's outputs (no PCI bus in a test)."""
    return smi.build_facts(query_gpu=smi.parse_query_gpu(fixture("nvidia_smi", gpu + "_query_gpu.csv")),
                           query=smi.parse_query(fixture("nvidia_smi", gpu + "_query.txt")),
                           topology=smi.parse_topology(fixture("nvidia_smi", gpu + "_topo.txt")))


@pytest.mark.parametrize("gpu,facts,branch,spec", [
    ("h200", UBUNTU24, "580", "nvidia-fabricmanager-580=580.82.07-*"),
    ("h200", DEBIAN12, "580", "nvidia-fabricmanager-580=580.82.07-*"),
    ("h100", UBUNTU22, "570", "nvidia-fabricmanager-570=570.172.08-*"),
    ("h100", RHEL9, "570", "nvidia-fabric-manager-570.172.08"),
])
def test_fabricmanager_on_an_hgx_host_is_pinned_to_the_driver(gpu, facts, branch, spec):
    gpu_facts = gpu_facts_from(gpu)
    assert gpu_facts["nvswitch"] is True and gpu_facts["count"] == 8
    plan = flt.nvidia_driver_plan(facts, branch=branch, nvswitch=gpu_facts["nvswitch"])
    result = flt.nvidia_fabricmanager_plan(plan, "auto", gpu_facts, "", "")
    assert result == {"wanted": True, "version": gpu_facts["driver_version"], "spec": spec}


def test_fabricmanager_follows_the_pinned_then_the_installed_version():
    gpu_facts = gpu_facts_from("h200")  # nvidia-smi: 580.82.07
    plan = flt.nvidia_driver_plan(UBUNTU24, branch="580")
    assert flt.nvidia_fabricmanager_plan(plan, "auto", gpu_facts, "580.95.05", "580.82.07")["spec"] == \
        "nvidia-fabricmanager-580=580.95.05-*"
    assert flt.nvidia_fabricmanager_plan(plan, "auto", gpu_facts, "", "580.95.05")["spec"] == \
        "nvidia-fabricmanager-580=580.95.05-*"


@pytest.mark.parametrize("gpu", ["l40s", "a100"])
def test_no_fabricmanager_on_a_pcie_host(gpu):
    gpu_facts = gpu_facts_from(gpu)
    if gpu == "l40s":
        assert gpu_facts["nvlink"] is False
    # A100 SXM4 has NVLink, but nvidia-smi shows no Fabric state: its NVSwitches appear on the PCI
    # bus only, which a unit test has not got. The PCIe L40S host has neither.
    assert gpu_facts["nvswitch"] is False
    plan = flt.nvidia_driver_plan(UBUNTU22, branch="570")
    assert flt.nvidia_fabricmanager_plan(plan, "auto", gpu_facts, "", "") == {
        "wanted": False, "version": "", "spec": None}
    assert flt.nvidia_fabricmanager_plan(plan, "always", gpu_facts, "", "")["spec"] == \
        "nvidia-fabricmanager-570=%s-*" % gpu_facts["driver_version"]
    hgx = gpu_facts_from("h100")
    assert flt.nvidia_fabricmanager_plan(plan, "never", hgx, "", "")["wanted"] is False

"""Package and repository selection for every supported OS (the Ubuntu and RHEL paths
cannot run on this machine; these tests are their coverage)."""
import pytest

from ansible_collections.kvcache.offload.plugins.filter import nvidia as flt
from ansible_collections.kvcache.offload.plugins.module_utils import nvidia_packages as np

UBUNTU22 = {"distribution": "Ubuntu", "distribution_version": "22.04", "architecture": "x86_64"}
UBUNTU24 = {"distribution": "Ubuntu", "distribution_version": "24.04", "architecture": "x86_64"}
DEBIAN12 = {"distribution": "Debian", "distribution_version": "12.11", "architecture": "x86_64"}
RHEL9 = {"distribution": "RedHat", "distribution_version": "9.6", "architecture": "x86_64"}
ROCKY9 = {"distribution": "Rocky", "distribution_version": "9.5", "architecture": "aarch64"}


def test_filters_are_registered():
    assert set(flt.FilterModule().filters()) == {
        "nvidia_driver_plan", "nvidia_fabricmanager_spec", "nvidia_toolkit_plan", "container_engine_packages",
        "nvidia_fabricmanager_plan", "nvidia_epel_plan", "nvidia_secure_boot_plan", "nvidia_apt_source_plan"}


@pytest.mark.parametrize("facts,repo_dir", [(UBUNTU22, "ubuntu2204"), (UBUNTU24, "ubuntu2404")])
def test_ubuntu_cuda_repo(facts, repo_dir):
    plan = flt.nvidia_driver_plan(facts, branch="570", kernel_modules="open")
    assert plan["error"] == ""
    assert plan["family"] == "apt"
    assert plan["repo"]["url"] == "https://developer.download.nvidia.com/compute/cuda/repos/%s/x86_64/" % repo_dir
    assert plan["repo"]["key_url"].endswith("/%s/x86_64/3bf863cc.pub" % repo_dir)
    assert plan["repo"]["keyring"] == "/etc/apt/keyrings/nvidia-cuda.asc"
    assert plan["packages"] == ["nvidia-open-570"]
    assert plan["pinning_package"] is None
    assert plan["fabricmanager_package"] == "nvidia-fabricmanager-570"
    prop = flt.nvidia_driver_plan(facts, branch="570", kernel_modules="proprietary")
    assert prop["packages"] == ["cuda-drivers-570"]


def test_ubuntu_590_uses_pinning_and_unversioned_names():
    plan = flt.nvidia_driver_plan(UBUNTU24, branch="590")
    assert plan["pinning_package"] == "nvidia-driver-pinning-590"
    assert plan["packages"] == ["nvidia-open"]
    assert plan["fabricmanager_package"] == "nvidia-fabricmanager"


def test_ubuntu_distribution_packages():
    plan = flt.nvidia_driver_plan(UBUNTU22, branch="570", source="distribution")
    assert plan["repo"] is None
    assert plan["packages"] == ["nvidia-headless-570-server-open", "nvidia-utils-570-server"]
    plan = flt.nvidia_driver_plan(UBUNTU24, branch="570", source="distribution", kernel_modules="proprietary",
                                  dkms=False)
    assert plan["packages"] == ["linux-modules-nvidia-570-server-generic", "nvidia-headless-no-dkms-570-server",
                                "nvidia-utils-570-server"]
    assert plan["fabricmanager_package"] == "nvidia-fabricmanager-570"


def test_ubuntu_cuda_repo_refuses_precompiled():
    assert "DKMS" in flt.nvidia_driver_plan(UBUNTU22, dkms=False)["error"]


@pytest.mark.parametrize("facts,arch", [(RHEL9, "x86_64"), (ROCKY9, "sbsa")])
def test_rhel_cuda_repo_module_streams(facts, arch):
    plan = flt.nvidia_driver_plan(facts, branch="580", kernel_modules="open")
    assert plan["error"] == "" and plan["family"] == "dnf"
    assert plan["repo"]["url"] == "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/%s/" % arch
    assert plan["repo"]["key_url"].endswith("D42D0685.pub")
    assert plan["repo"]["keyring"] is None
    assert plan["module_stream"] == "nvidia-driver:580-open"
    assert plan["packages"] == ["@nvidia-driver:580-open/default"]
    assert flt.nvidia_driver_plan(facts, branch="570", kernel_modules="proprietary")["module_stream"] == \
        "nvidia-driver:570-dkms"
    assert flt.nvidia_driver_plan(facts, branch="570", kernel_modules="proprietary", dkms=False)["module_stream"] == \
        "nvidia-driver:570"
    assert "DKMS" in flt.nvidia_driver_plan(facts, kernel_modules="open", dkms=False)["error"]
    assert plan["fabricmanager_package"] == "nvidia-fabric-manager"


def test_rhel_has_no_distribution_driver():
    assert "cuda_repo" in flt.nvidia_driver_plan(RHEL9, source="distribution")["error"]


def test_debian_cuda_repo_and_distribution():
    plan = flt.nvidia_driver_plan(DEBIAN12, branch="580")
    assert plan["repo"]["url"].endswith("/debian12/x86_64/")
    assert plan["pinning_package"] == "nvidia-driver-pinning-580"
    assert plan["packages"] == ["nvidia-open"]
    assert "nvidia-driver-pinning" in flt.nvidia_driver_plan(DEBIAN12, branch="570")["error"]
    dist = flt.nvidia_driver_plan(DEBIAN12, branch="535", source="distribution", kernel_modules="proprietary")
    assert dist["error"] == ""
    assert dist["packages"] == ["nvidia-kernel-dkms", "nvidia-smi", "nvidia-persistenced", "libcuda1"]
    wrong = flt.nvidia_driver_plan(DEBIAN12, branch="580", source="distribution")
    assert "ships NVIDIA driver branch 535" in wrong["error"] and "nvidia_driver_branch" in wrong["error"]
    fm = flt.nvidia_driver_plan(DEBIAN12, branch="535", source="distribution", nvswitch=True)
    assert "Fabric Manager" in fm["error"]


@pytest.mark.parametrize("branch,version,needle", [
    ("r580", "", "three-digit"), ("58", "", "three-digit"), ("580.1", "", "three-digit"),
    ("580", "580", "full driver version"), ("580", "570.172.08", "not on nvidia_driver_branch"),
])
def test_bad_branch_formats(branch, version, needle):
    assert needle in flt.nvidia_driver_plan(UBUNTU22, branch=branch, driver_version=version)["error"]


def test_good_version_pin():
    assert np.validate_branch("570", "570.172.08") == ""
    assert np.validate_branch("580", "580.95") == ""


@pytest.mark.parametrize("facts,kw,needle", [
    ({"distribution": "CentOS", "distribution_version": "7"}, {}, "not supported"),
    ({"distribution": "Ubuntu", "distribution_version": "20.04"}, {}, "not supported"),
    (UBUNTU22, {"kernel_modules": "both"}, "nvidia_driver_kernel_modules"),
    (UBUNTU22, {"source": "runfile"}, "nvidia_driver_source"),
    (dict(UBUNTU22, architecture="ppc64le"), {}, "ppc64le"),
])
def test_unsupported_inputs(facts, kw, needle):
    assert needle in flt.nvidia_driver_plan(facts, **kw)["error"]


def test_fabricmanager_exact_version():
    apt = flt.nvidia_driver_plan(UBUNTU22, branch="570")
    assert flt.nvidia_fabricmanager_spec(apt, "570.172.08") == "nvidia-fabricmanager-570=570.172.08-*"
    dnf = flt.nvidia_driver_plan(RHEL9, branch="570")
    assert flt.nvidia_fabricmanager_spec(dnf, "570.172.08") == "nvidia-fabric-manager-570.172.08"
    assert flt.nvidia_fabricmanager_spec(dnf, "") is None


def test_toolkit_repos():
    apt = flt.nvidia_toolkit_plan(UBUNTU24)
    assert apt["repo"]["url"] == "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
    assert apt["repo"]["key_url"] == "https://nvidia.github.io/libnvidia-container/gpgkey"
    assert apt["repo"]["keyring"] == "/etc/apt/keyrings/nvidia-container-toolkit.asc"
    assert apt["packages"] == ["nvidia-container-toolkit"]
    dnf = flt.nvidia_toolkit_plan(ROCKY9, channel="experimental")
    assert dnf["repo"]["url"] == "https://nvidia.github.io/libnvidia-container/experimental/rpm/$basearch"
    assert "channel" in flt.nvidia_toolkit_plan(DEBIAN12, channel="nightly")["error"]
    assert "not supported" in flt.nvidia_toolkit_plan({"distribution": "Arch", "distribution_version": "1"})["error"]
    assert "aarch" in flt.nvidia_toolkit_plan(dict(DEBIAN12, architecture="s390x"))["error"]


def test_engine_packages():
    assert flt.container_engine_packages(DEBIAN12)["packages"] == ["docker.io"]
    assert flt.container_engine_packages(UBUNTU22, docker_source="docker_ce")["packages"][0] == "docker-ce"
    assert "docker_ce" in flt.container_engine_packages(RHEL9)["error"]
    assert flt.container_engine_packages(RHEL9, engine="podman") == {
        "error": "", "packages": ["podman"], "service": "podman.socket", "repo": None}
    ce = flt.container_engine_packages(UBUNTU24, docker_source="docker_ce")
    assert ce["repo"]["url"] == "https://download.docker.com/linux/ubuntu"
    assert ce["repo"]["keyring"] == "/etc/apt/keyrings/docker.asc" and ce["repo"]["key_url"].endswith("/gpg")
    rhel_ce = flt.container_engine_packages(RHEL9, docker_source="docker_ce")
    assert rhel_ce["repo"]["url"] == "https://download.docker.com/linux/rhel/$releasever/$basearch/stable"
    assert "container_runtime_docker_source" in flt.container_engine_packages(DEBIAN12, docker_source="snap")["error"]
    assert "container_runtime_engine" in flt.container_engine_packages(DEBIAN12, engine="lxc")["error"]
    assert "not supported" in flt.container_engine_packages({"distribution": "Arch", "distribution_version": "1"})["error"]


def test_exact_version_pin():
    assert flt.nvidia_driver_plan(UBUNTU22, branch="570", driver_version="570.172.08")["packages"] == [
        "nvidia-open-570=570.172.08-*"]
    assert flt.nvidia_driver_plan(DEBIAN12, branch="580", driver_version="580.95.05")["packages"] == [
        "nvidia-open=580.95.05-*"]
    assert "apt distributions only" in flt.nvidia_driver_plan(RHEL9, branch="570", driver_version="570.1")["error"]
    assert "cuda_repo" in flt.nvidia_driver_plan(UBUNTU22, branch="570", driver_version="570.1",
                                                 source="distribution")["error"]

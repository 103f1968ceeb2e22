"""Unit tests for kvcache.offload.nfs_kernel_problems on real kernel release strings."""
import pytest

from ansible_collections.kvcache.offload.plugins.filter import nfs_kernel as n
from ansible_collections.kvcache.offload.plugins.filter.nfs_kernel import FilterModule

# The role's default option string (kvcache_mount_options with its defaults).
DEFAULT = "vers=4.1,proto=rdma,trunkdiscovery,write=eager,rsize=65536,wsize=65536"


def options_refused(kernel, options=DEFAULT):
    return [p["option"] for p in n.nfs_kernel_problems(options, kernel)]


@pytest.mark.parametrize("kernel, refused", [
    # Ubuntu 22.04 GA kernel: no trunkdiscovery (5.18), write= (5.12) is there.
    ("5.15.0-91-generic", ["trunkdiscovery"]),
    # RHEL 9.4 (and Rocky 9.4): 5.14 upstream base, trunkdiscovery backported in 5.14.0-170.el9.
    ("5.14.0-427.13.1.el9_4.x86_64", []),
    # RHEL 9.0 and 9.1 GA kernels predate the backport.
    ("5.14.0-70.13.1.el9_0.x86_64", ["trunkdiscovery"]),
    ("5.14.0-162.6.1.el9_1.x86_64", ["trunkdiscovery"]),
    ("5.14.0-170.el9.x86_64", []),
    # Ubuntu 22.04 HWE, 24.04, Debian 12: new enough.
    ("6.8.0-45-generic", []),
    ("6.1.0-18-amd64", []),
    ("5.18.0-1-amd64", []),
    # Older than write=eager too (Ubuntu 20.04's GA kernel, RHEL 8).
    ("5.4.0-150-generic", ["trunkdiscovery", "write"]),
    ("4.18.0-513.5.1.el8_9.x86_64", ["trunkdiscovery", "write"]),
    ("5.11.0-49-generic", ["trunkdiscovery", "write"]),
    ("5.12.0", ["trunkdiscovery"]),
])
def test_default_options_on_real_kernels(kernel, refused):
    assert options_refused(kernel) == refused


def test_the_entry_names_option_kernel_and_requirement():
    (problem,) = n.nfs_kernel_problems(DEFAULT, "5.15.0-91-generic")
    assert problem["option"] == "trunkdiscovery"
    assert problem["kernel"] == "5.15.0-91-generic"
    assert problem["requires"] == "Linux 5.18 or later (RHEL 9: 5.14.0-170.el9 or later)"
    assert "a43bf6044464" in problem["source"]


def test_write_requirement_has_no_backport_note():
    (problem,) = n.nfs_kernel_problems("write=eager", "5.10.0-28-amd64")
    assert problem["requires"] == "Linux 5.12 or later"


def test_a_list_and_other_write_modes_and_notrunkdiscovery():
    assert options_refused("5.4.0-150-generic", ["vers=4.1", " write=wait ", "notrunkdiscovery", ""]) == [
        "write", "notrunkdiscovery"]


def test_options_it_does_not_judge_pass():
    assert options_refused("3.10.0-1160.el7.x86_64", "vers=4.1,proto=tcp,nconnect=8,_netdev") == []


@pytest.mark.parametrize("kernel", ["", None, "unknown", "linux"])
def test_an_unreadable_kernel_gives_no_verdict(kernel):
    assert n.nfs_kernel_problems(DEFAULT, kernel) == []
    assert n.kernel_knows(kernel, "trunkdiscovery") is None


def test_the_filter_is_registered():
    assert FilterModule().filters()["nfs_kernel_problems"] is n.nfs_kernel_problems

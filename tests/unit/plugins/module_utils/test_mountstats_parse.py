"""module_utils/mountstats on /proc/self/mountstats samples (tests/unit/fixtures/mountstats)."""
import os

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import mountstats as ms

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "mountstats")


def load(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return ms.parse(handle.read())


def test_parse_lists_every_mount_in_order():
    mounts = load("v41_rdma_pnfs.txt")
    assert [m["mountpoint"] for m in mounts] == ["/sys", "/proc", "/", "/mnt/kvcache"]
    assert mounts[0]["fstype"] == "sysfs"


def test_v41_over_rdma_with_pnfs():
    facts = ms.summary(ms.find(load("v41_rdma_pnfs.txt"), "/mnt/kvcache"))
    assert facts["device"] == "10.20.0.5:/kvcache"
    assert facts["fstype"] == "nfs4"
    assert facts["vers"] == "4.1"
    assert facts["proto"] == "rdma"
    assert facts["transport_protos"] == ["rdma"]
    assert facts["pnfs"] == "LAYOUT_NFSV4_1_FILES"
    assert facts["sessions"] is True
    assert facts["rsize"] == facts["wsize"] == 262144
    assert facts["opts"]["write"] == "eager"
    assert facts["opts"]["port"] == "20049"


def test_v41_over_rdma_matches_the_seed_request():
    mount = ms.find(load("v41_rdma_pnfs.txt"), "/mnt/kvcache/")
    assert ms.compare(mount, vers="4.1", proto="rdma", rsize=262144, wsize=262144, require_pnfs=True) == []


def test_tcp_where_rdma_was_asked_is_reported():
    mount = ms.find(load("v41_tcp.txt"), "/mnt/kvcache")
    assert ms.compare(mount, vers="4.1", proto="rdma") == ["transport is tcp, asked for rdma"]


def test_pnfs_not_configured_is_reported_only_when_required():
    mount = ms.find(load("v41_tcp.txt"), "/mnt/kvcache")
    assert ms.summary(mount)["pnfs"] is None
    assert ms.compare(mount, vers="4.1", proto="tcp") == []
    assert ms.compare(mount, vers="4.1", proto="tcp", require_pnfs=True) == [
        "pNFS is not in use (no layout type in the nfsv4 line)"]


def test_nconnect_counts_transports():
    mount = ms.find(load("v41_tcp_nconnect4.txt"), "/mnt/kvcache")
    facts = ms.summary(mount)
    assert facts["nconnect"] == 4
    assert facts["transports"] == 4
    assert ms.compare(mount, vers="4.1", proto="tcp", nconnect=4) == []
    assert ms.compare(mount, nconnect=8) == ["nconnect is 4, asked for 8"]


def test_v3_is_the_wrong_version():
    mount = ms.find(load("v3_tcp.txt"), "/mnt/kvcache")
    facts = ms.summary(mount)
    assert facts["fstype"] == "nfs"
    assert facts["vers"] == "3"
    assert facts["sessions"] is False
    problems = ms.compare(mount, vers="4.1", proto="rdma", rsize=262144)
    assert problems == ["NFS version is 3, asked for 4.1", "transport is tcp, asked for rdma",
                        "rsize is 65536, asked for 262144"]


def test_not_mounted_and_not_nfs():
    mounts = load("v41_tcp.txt")
    assert ms.find(mounts, "/mnt/other") is None
    assert ms.compare(None, vers="4.1") == ["not mounted"]
    assert ms.compare(ms.find(mounts, "/"), vers="4.1") == ["fstype is ext4, not NFS"]


def test_vers_4_means_4_0_and_missing_vers_on_nfs4():
    text = ("device srv:/x mounted on /m with fstype nfs4 statvers=1.1\n"
            "\topts:\trw,vers=4,proto=tcp\n\txprt:\ttcp 1 2 3\n")
    assert ms.summary(ms.parse(text)[0])["vers"] == "4.0"
    text = "device srv:/x mounted on /m with fstype nfs4 statvers=1.1\n\topts:\trw,proto=tcp\n"
    assert ms.summary(ms.parse(text)[0])["vers"] == "4.0"


def test_stacked_mounts_use_the_top_one():
    text = ("device a:/x mounted on /m with fstype nfs4 statvers=1.1\n\topts:\trw,vers=4.1,proto=tcp\n"
            "device b:/y mounted on /m with fstype nfs4 statvers=1.1\n\topts:\trw,vers=4.1,proto=rdma\n")
    assert ms.summary(ms.find(ms.parse(text), "/m"))["device"] == "b:/y"


@pytest.mark.parametrize("line", ["garbage", "device without the words", "\topts:\torphan"])
def test_malformed_lines_are_ignored(line):
    assert ms.parse(line + "\n") == []

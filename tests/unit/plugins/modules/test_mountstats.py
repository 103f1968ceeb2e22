"""The mountstats module on captured-format samples: passes, fails with what differs."""
import os

from ansible_collections.kvcache.offload.plugins.modules import mountstats

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "mountstats")


def args(sample, **extra):
    data = {"path": "/mnt/kvcache", "mountstats_file": os.path.join(FIXTURES, sample)}
    data.update(extra)
    return data


def test_rdma_mount_passes_and_reports_facts(run_module):
    result, failed = run_module(mountstats, args("v41_rdma_pnfs.txt", vers="4.1", proto="rdma", require_pnfs=True))
    assert not failed
    assert result["changed"] is False
    assert result["mount"]["proto"] == "rdma"
    assert result["mount"]["pnfs"] == "LAYOUT_NFSV4_1_FILES"
    assert result["problems"] == []


def test_tcp_fallback_fails_with_a_fix(run_module):
    result, failed = run_module(mountstats, args("v41_tcp.txt", vers="4.1", proto="rdma"))
    assert failed
    assert result["problems"] == ["transport is tcp, asked for rdma"]
    assert "rpcrdma" in result["msg"] and "Fix:" in result["msg"]


def test_a_mount_on_another_security_flavour_fails(run_module):
    """Kerberos (kvcache_nfs_security krb5p): a mount the client negotiated down to sec=sys is not
    the one asked for. The module did not read sec= before."""
    result, failed = run_module(mountstats, args("v41_tcp.txt", vers="4.1", proto="tcp", sec="krb5p"))
    assert failed
    assert result["problems"] == ["security flavour is sys, asked for krb5p"]
    result, failed = run_module(mountstats, args("v41_tcp.txt", vers="4.1", proto="tcp", sec="sys"))
    assert not failed and result["mount"]["sec"] == "sys"


def test_v3_fails(run_module):
    result, failed = run_module(mountstats, args("v3_tcp.txt", vers="4.1"))
    assert failed
    assert result["problems"] == ["NFS version is 3, asked for 4.1"]


def test_path_not_mounted_fails(run_module):
    result, failed = run_module(mountstats, args("v41_rdma_pnfs.txt", path="/mnt/elsewhere"))
    assert failed
    assert "is not a mount point" in result["msg"]


def test_unreadable_file_fails(run_module, tmp_path):
    result, failed = run_module(mountstats, {"path": "/mnt/kvcache", "mountstats_file": str(tmp_path / "none")})
    assert failed
    assert "Cannot read" in result["msg"]


def test_check_mode_reads_only(run_module):
    result, failed = run_module(mountstats, args("v41_tcp_nconnect4.txt", nconnect=4), check_mode=True)
    assert not failed
    assert result["mount"]["nconnect"] == 4

# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gds_facts on captured gdscheck and nvidia-fs outputs; gdscheck itself is a script printing a capture."""
import os
import stat

from ansible_collections.kvcache.offload.plugins.modules import gds_facts

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gds")


def fx(name):
    return os.path.join(FIXTURES, name)


def base(tmp_path, **extra):
    args = {"nvfs_stats_file": str(tmp_path / "absent-stats"), "rw_stats_param": str(tmp_path / "absent-param")}
    args.update(extra)
    return args


def fake_gdscheck(tmp_path, capture):
    script = tmp_path / "gdscheck"
    script.write_text("#!/bin/sh\n[ \"$1\" = -p ] || exit 2\ncat '%s'\n" % fx(capture))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_runs_gdscheck_and_reports_compat_mode(run_module, tmp_path):
    path = fake_gdscheck(tmp_path, "gdscheck_1.13.1.3_nfs_rdma_mount.txt")
    result, failed = run_module(gds_facts, base(tmp_path, gdscheck_path=path))
    assert not failed and result["changed"] is False
    assert result["gds"]["gdscheck_rc"] == 0
    assert result["gds"]["gdscheck"]["drivers"]["NFS"]["gds"] is True
    assert [p["code"] for p in result["problems"]] == ["compat_allowed"]
    assert result["ansible_facts"]["gds_facts"]["compat_mode"] == {"allowed": True, "forced": False}


def test_fail_on_problems_names_each(run_module, tmp_path):
    args = base(tmp_path, gdscheck_output_file=fx("gdscheck_1.11.1.6_nfs_unsupported.txt"), fail_on_problems=True)
    result, failed = run_module(gds_facts, args)
    assert failed
    assert "fs_unsupported: NFS : Unsupported" in result["msg"] and "compat_allowed" in result["msg"]
    assert "Fix:" in result["msg"]


def test_missing_gdscheck_is_a_problem(run_module, tmp_path):
    result, failed = run_module(gds_facts, base(tmp_path, gdscheck_path=str(tmp_path / "nope")))
    assert not failed
    assert [p["code"] for p in result["problems"]] == ["gdscheck_missing"]


def test_reads_nvfs_stats_and_param(run_module, tmp_path):
    param = tmp_path / "rw"
    param.write_text("1\n")
    args = base(tmp_path, run_gdscheck=False, nvfs_stats_file=fx("nvidia_fs_stats_nfs_client_io_stats.txt"), rw_stats_param=str(param))
    result, failed = run_module(gds_facts, args, check_mode=True)
    assert not failed
    assert result["gds"]["rw_stats_enabled"] is True
    assert result["gds"]["nvfs"]["reads"]["n"] == 424436862
    assert result["gds"]["gdscheck"] is None and result["problems"] == []


def test_baseline_without_growth_fails_with_causes(run_module, tmp_path):
    stats = fx("nvidia_fs_stats_nfs_client_io_stats.txt")
    first = run_module(gds_facts, base(tmp_path, run_gdscheck=False, nvfs_stats_file=stats))[0]
    args = base(tmp_path, run_gdscheck=False, nvfs_stats_file=stats, baseline=first["gds"]["nvfs"], fail_on_problems=True)
    result, failed = run_module(gds_facts, args)
    assert failed
    assert [c["code"] for c in result["path"]["causes"]] == ["no_gds_reads", "no_gds_writes"]


def test_baseline_with_growth_passes(run_module, tmp_path):
    source = fx("nvidia_fs_stats_nfs_client_io_stats.txt")
    first = run_module(gds_facts, base(tmp_path, run_gdscheck=False, nvfs_stats_file=source))[0]
    with open(source) as handle:
        later = handle.read().replace("n=424436862", "n=424436900").replace("n=309770912 ok", "n=309770950 ok")
    after = tmp_path / "stats"
    after.write_text(later)
    args = base(tmp_path, run_gdscheck=False, nvfs_stats_file=str(after), baseline=first["gds"]["nvfs"], fail_on_problems=True,
                cufile_stats_file=fx("gds_stats_level3.txt"))
    result, failed = run_module(gds_facts, args)
    assert not failed, result.get("msg")
    assert result["path"] == {"ok": True, "reads": 38, "writes": 38, "causes": []}


def test_module_not_loaded_in_path_verdict(run_module, tmp_path):
    baseline = {"reads": {"n": 1}, "writes": {"n": 1}, "io_stats": True}
    result, failed = run_module(gds_facts, base(tmp_path, run_gdscheck=False, baseline=baseline))
    assert not failed
    assert result["gds"]["nvfs"] is None
    assert [c["code"] for c in result["path"]["causes"]] == ["nvidia_fs_not_loaded"]

# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage 7 (gds_path) of the validation, up to the hardware boundary.

Per node, the same modules and order as roles/validation/tasks/nodes_gds.yml: the real gds_facts
(a gdscheck printing a capture, the nvidia-fs stats file), the real lmcache_storage_probe with
backend=gds (store, then load in a second process) through the LMCache double's GdsBackend
(tests/unit/fixtures/fake_lmcache: it bumps the nvidia-fs counters of the stats file as the kernel
module does on every GDS I/O, or not, in the POSIX fallback), gds_facts again, then the real
validation_report module judges. Only cuFile and nvidia-fs themselves are doubles. The stats
files are tests/unit/fixtures/gds/nvidia_fs_stats_* (see SOURCES.md).
"""
import json
import os
import shutil
import stat
import sys

import pytest

from ansible_collections.kvcache.offload.plugins.modules import gds_facts, lmcache_storage_probe, validation_report

HERE = os.path.dirname(os.path.abspath(__file__))
GDS = os.path.join(HERE, "..", "..", "fixtures", "gds")
FAKE = os.path.join(HERE, "..", "..", "fixtures", "fake_lmcache")
RUN_ID = "20261201T220000Z-000001"
RDMA_MOUNT = {"filesystems": [{"target": "/mnt/kvcache", "source": "10.0.0.5:/kvcache", "fstype": "nfs4",
                               "options": "rw,relatime,vers=4.1,rsize=1048576,proto=rdma,port=20049"}]}


def fx(name):
    return os.path.join(GDS, name)


def gdscheck(tmp_path, capture, compat="false"):
    """A gdscheck printing a capture; compat: the capture's properties.use_compat_mode as set."""
    text = open(fx(capture)).read().replace("properties.use_compat_mode : true", "properties.use_compat_mode : %s" % compat)
    out = tmp_path / ("gdscheck-%s.txt" % capture)
    out.write_text(text)
    script = tmp_path / "gdscheck"
    script.write_text("#!/bin/sh\n[ \"$1\" = -p ] || exit 2\ncat '%s'\n" % out)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def run_node(run_module, tmp_path, host, mode="", stats="nvidia_fs_stats_2.28.4_probe_before.txt",
             capture="gdscheck_1.13.1.3_nfs_rdma_mount.txt", compat="false", mount=None, stats_loaded=True):
    """One node's stage 7, as nodes_gds.yml registers it."""
    node = tmp_path / host
    (node / "gds").mkdir(parents=True)
    (node / "tier").mkdir()
    nvfs = node / "nvidia-fs-stats"
    if stats_loaded:
        shutil.copy(fx(stats), str(nvfs))
    param = node / "rw_stats_enabled"
    param.write_text("1\n")
    config = node / "lmcache-config.yaml"
    config.write_text("chunk_size: 256\ngds_path: %s\nuse_gds: true\n" % (node / "gds"))
    files = {"nvfs_stats_file": str(nvfs), "rw_stats_param": str(param)}
    before = run_module(gds_facts, dict(files, gdscheck_path=gdscheck(node, capture, compat)))[0]
    probe = {"python": sys.executable, "config_file": str(config), "backend": "gds", "timeout": 90,
             "probe_id": "validate-%s-gds-%s" % (RUN_ID, host),
             "environment": {"PYTHONPATH": FAKE, "FAKE_LMCACHE_TIER": str(node / "tier"), "FAKE_LMCACHE_MODE": mode,
                             "FAKE_LMCACHE_GDS": str(node / "gds"), "FAKE_NVFS_STATS": str(nvfs)}}
    store = run_module(lmcache_storage_probe, dict(probe, action="store"))[0]
    load = run_module(lmcache_storage_probe, dict(probe, action="load"))[0]
    after = run_module(gds_facts, dict(files, run_gdscheck=False))[0]
    mount = {"rc": 0, "stdout": json.dumps(mount or RDMA_MOUNT)}
    return {"run_id": RUN_ID, "host": host, "unreachable": False,
            "gds": {"before": before, "mount": mount, "store": store, "load": load, "after": after,
                    "gds_path": str(node / "gds")}}


def judge(run_module, tmp_path, nodes, gds=True):
    args = {"run": {"id": RUN_ID, "nodes_in_play": [n["host"] for n in nodes]},
            "expected": {"tier": "fs", "gds": gds, "gds_path": "/mnt/kvcache/gds", "lmcache_mode": "inprocess"},
            "nodes": dict((n["host"], n) for n in nodes),
            "settings": {"selected_stages": ["gds_path"], "required_stages": ["gds_path"]},
            "report_dir": str(tmp_path / "reports"), "report_name": "validation-%s" % RUN_ID}
    result, failed = run_module(validation_report, args)
    assert not failed, result
    stage = [s for s in result["report"]["stages"] if s["id"] == "gds_path"][0]
    causes = dict((c["id"], c) for c in result["report"]["causes"])
    return result, stage, causes


def test_counters_grow_on_every_node_passes(run_module, tmp_path):
    nodes = [run_node(run_module, tmp_path, h) for h in ("gpu-node1", "gpu-node2")]
    assert nodes[0]["gds"]["store"].get("connector") == "GdsBackend", nodes[0]["gds"]["store"]
    assert nodes[0]["gds"]["load"]["ok"]
    result, stage, causes = judge(run_module, tmp_path, nodes)
    assert stage["status"] == "pass", stage
    assert result["result"] == "pass" and not causes
    assert stage["numbers"] == {"nodes": 2, "nodes_on_gds": 2, "nvfs_reads": 2, "nvfs_writes": 2}
    rows = stage["details"]["nodes"]
    assert [(r["host"], r["reads"], r["writes"], r["read_mib"], r["write_mib"]) for r in rows] == [
        ("gpu-node1", 1, 1, 1, 1), ("gpu-node2", 1, 1, 1, 1)]
    assert rows[0]["mount"]["rdma"] is True
    assert os.path.exists(result["paths"]["markdown"])


def test_posix_fallback_counters_did_not_move(run_module, tmp_path):
    """The silent fallback: LMCache stores and loads bit-exact, but nvidia-fs saw no I/O."""
    good = run_node(run_module, tmp_path, "gpu-node1")
    posix = run_node(run_module, tmp_path, "gpu-node2", mode="posix")
    assert posix["gds"]["load"]["ok"] and posix["gds"]["load"]["sha256"] == posix["gds"]["store"]["sha256"]
    result, stage, causes = judge(run_module, tmp_path, [good, posix])
    assert stage["status"] == "fail" and result["failed_required"] == ["gds_path"]
    assert list(causes) == ["gds_counters_static"]
    assert causes["gds_counters_static"]["hosts"] == ["gpu-node2"]
    assert "gpu-node1" not in stage["reason"] and "reads n +0" in stage["reason"]


def test_nvidia_fs_not_loaded(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1", stats_loaded=False)
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail"
    assert "gds_nvidia_fs_not_loaded" in causes
    assert "rw_stats" not in causes["gds_nvidia_fs_not_loaded"]["message"]


def test_compat_mode_on_in_cufile_json(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1", compat="true")
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_compat_mode"]
    assert "allow_compat_mode" in causes["gds_compat_mode"]["fix"]


def test_cufile_counted_posix_io(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1")
    stats = open(fx("gds_stats_level3.txt")).read()
    node["gds"]["load"]["cufile_stats"] = stats.replace("n=78193 posix=0", "n=78193 posix=12")
    node["gds"]["store"]["cufile_stats"] = stats
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_compat_mode"]
    assert stage["details"]["nodes"][0]["cufile_posix"] == {"reads": 12, "writes": 0}


def test_no_rdma_mount(run_module, tmp_path):
    tcp = {"filesystems": [dict(RDMA_MOUNT["filesystems"][0], options="rw,vers=4.1,proto=tcp")]}
    node = run_node(run_module, tmp_path, "gpu-node1", mount=tcp)
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_no_rdma_mount"]
    assert "proto=tcp" in causes["gds_no_rdma_mount"]["message"]


def test_gdscheck_says_nfs_unsupported(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1", capture="gdscheck_1.11.1.6_nfs_unsupported.txt")
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_fs_unsupported"]
    assert "NFS : Unsupported" in causes["gds_fs_unsupported"]["message"]


def test_io_stats_disabled_counters_prove_nothing(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1", stats="nvidia_fs_stats_1.14_io_stats_disabled.txt")
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_counters_static"]
    assert "rw_stats_enabled" in causes["gds_counters_static"]["message"]


def test_lmcache_disabled_gds_itself(run_module, tmp_path):
    node = run_node(run_module, tmp_path, "gpu-node1", mode="gds_off")
    assert node["gds"]["store"]["use_gds"] is False
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail"
    assert set(causes) == {"gds_lmcache_posix", "gds_counters_static"}


def test_gds_off_is_skipped_with_the_reason(run_module, tmp_path):
    result, stage, causes = judge(run_module, tmp_path, [{"run_id": RUN_ID, "host": "lab-node1", "gds": {}}], gds=False)
    assert stage["status"] == "skipped" and stage["reason"].startswith("GDS is off")
    assert result["result"] == "pass" and not causes


def test_stats_fixtures_keep_nvfs_stat_c_format():
    """The before/after pair has the layout of src/nvfs-stat.c (tab-aligned labels, IO stats on)."""
    from ansible_collections.kvcache.offload.plugins.module_utils import gds
    before = gds.parse_nvfs_stats(open(fx("nvidia_fs_stats_2.28.4_probe_before.txt")).read())
    after = gds.parse_nvfs_stats(open(fx("nvidia_fs_stats_2.28.4_probe_after.txt")).read())
    assert (before["stats_version"], before["driver_version"], before["io_stats"]) == ("4.0", "2.28.4", True)
    assert gds.gds_path_verdict(before, after)["ok"] is True
    assert gds.gds_path_verdict(before, gds.parse_nvfs_stats(open(fx("nvidia_fs_stats_2.28.4_probe_after_posix.txt")).read()))["ok"] is False


@pytest.mark.parametrize("shape", ["reads", "writes"])
def test_error_counters_fail_even_when_counts_grow(run_module, tmp_path, shape):
    node = run_node(run_module, tmp_path, "gpu-node1")
    after = node["gds"]["after"]["gds"]["nvfs"]
    after[shape]["err"] = after[shape]["err"] + 3
    _result, stage, causes = judge(run_module, tmp_path, [node])
    assert stage["status"] == "fail" and list(causes) == ["gds_io_errors"]


def test_stage_6_on_a_gds_node_goes_through_the_gds_backend(run_module, tmp_path):
    """With kvcache_fs_gds the LMCache config has gds_path and no remote backend: stage 6's probe
    (backend left at auto) must use the GdsBackend, not fail with 'no remote backend connected'."""
    node = tmp_path / "n"
    (node / "gds").mkdir(parents=True)
    (node / "tier").mkdir()
    config = node / "lmcache-config.yaml"
    config.write_text("chunk_size: 256\ngds_path: %s\nuse_gds: true\n" % (node / "gds"))
    probe = {"python": sys.executable, "config_file": str(config), "timeout": 90, "probe_id": "validate-1",
             "environment": {"PYTHONPATH": FAKE, "FAKE_LMCACHE_TIER": str(node / "tier"),
                             "FAKE_LMCACHE_GDS": str(node / "gds")}}
    stored, failed = run_module(lmcache_storage_probe, dict(probe, action="store"))
    assert not failed, stored
    loaded, failed = run_module(lmcache_storage_probe, dict(probe, action="load", expected_sha256=stored["sha256"]))
    assert not failed, loaded
    assert (stored["connector"], loaded["connector"], loaded["match"]) == ("GdsBackend", "GdsBackend", True)
    assert os.listdir(str(node / "gds"))


def test_engines_older_than_the_s3_expiration_are_named(run_module, tmp_path):
    """The guard for LMCache 0.5.6's permanent false hits on deleted S3 objects
    (tests/integration/test_lmcache_s3_deleted_objects.py): a warning naming the old engines."""
    uptime = {"rc": 0, "stdout": "kvcache-vllm@gpu0.service 4242 864000\nkvcache-vllm@gpu1.service 4343 3600\n"}
    args = {"run": {"id": RUN_ID, "nodes_in_play": ["gpu-node1"]},
            "expected": {"tier": "s3", "s3_expiration_days": 7, "lmcache_mode": "inprocess"},
            "nodes": {"gpu-node1": {"run_id": RUN_ID, "host": "gpu-node1", "engine_uptime": uptime}},
            "settings": {"selected_stages": [], "required_stages": []}}
    result, failed = run_module(validation_report, args)
    assert not failed, result
    causes = dict((c["id"], c) for c in result["report"]["causes"])
    assert causes["s3_expired_false_hits"]["severity"] == "warning"
    assert "kvcache-vllm@gpu0.service (10.0 days)" in causes["s3_expired_false_hits"]["message"]
    assert "gpu1" not in causes["s3_expired_false_hits"]["message"]
    assert any(line.startswith("  warning s3_expired_false_hits") for line in result["summary"])
    args["expected"]["s3_expiration_days"] = 30
    result, failed = run_module(validation_report, args)
    assert "s3_expired_false_hits" not in [c["id"] for c in result["report"]["causes"]]

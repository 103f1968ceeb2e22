# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GDS parsers on real captured outputs (tests/unit/fixtures/gds, sources in SOURCES.md)."""
import copy
import os

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import gds

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gds")


def text(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def codes(problems):
    return [p["code"] for p in problems]


def test_gdscheck_1_11_nfs_unsupported():
    parsed = gds.parse_gdscheck(text("gdscheck_1.11.1.6_nfs_unsupported.txt"))
    assert parsed["format"] == "status"
    assert (parsed["gds_release"], parsed["nvidia_fs_version"], parsed["libcufile_version"]) == ("1.11.1.6", "2.25", "2.12")
    assert parsed["drivers"]["NFS"] == {"status": "Unsupported", "modes": [], "gds": False, "compat": None}
    assert parsed["drivers"]["NVMe"]["gds"] is True
    assert parsed["rdma"] == {"peerdirect": True, "library_loaded": False, "devices_configured": False,
                              "devices_up": 0, "devices_down": 0}
    assert parsed["properties"]["properties.use_compat_mode"] == "true"
    assert parsed["properties"]["fs.lustre.posix_gds_min_kb"] == "0"
    assert [g["index"] for g in parsed["gpus"]] == [0, 1, 2, 3]
    assert parsed["gpus"][0]["supports_gds"] and parsed["gpus"][0]["iommu"] == "Pass-through or Enabled"
    assert parsed["platform"]["open_driver"] is True
    assert parsed["platform"]["cuda_driver_version"] == "12060"
    assert parsed["platform"]["verification"] == "succeeded"
    assert parsed["platform"]["warnings"] and "iommu" in parsed["platform"]["warnings"][0]
    assert codes(gds.readiness(parsed)) == ["fs_unsupported", "compat_allowed"]


def test_gdscheck_1_13_nfs_supported_only_compat_mode_is_refused():
    parsed = gds.parse_gdscheck(text("gdscheck_1.13.1.3_nfs_rdma_mount.txt"))
    assert parsed["drivers"]["NFS"]["gds"] is True
    assert parsed["drivers"]["NVMe P2PDMA"]["gds"] is False
    assert gds.compat_mode(parsed["properties"]) == {"allowed": True, "forced": False}
    # NFS over RDMA carries GDS with no cuFile RDMA devices (this capture ran gdsio GPU_DIRECT on it).
    assert codes(gds.readiness(parsed)) == ["compat_allowed"]
    assert gds.readiness(parsed, allow_compat=True) == []


def test_listed_rdma_addresses_must_be_configured():
    parsed = gds.parse_gdscheck(text("gdscheck_1.13.1.3_nfs_rdma_mount.txt"))
    problems = gds.readiness(parsed, rdma_dev_addrs=["192.168.10.30"], allow_compat=True)
    assert codes(problems) == ["rdma_devices_not_configured"]
    assert "192.168.10.30" in problems[0]["what"]


def test_rdma_configured_fragment():
    parsed = gds.parse_gdscheck(text("gdscheck_rdma_configured_fragment.txt"))
    assert parsed["rdma"] == {"peerdirect": True, "library_loaded": True, "devices_configured": True,
                              "devices_up": 8, "devices_down": 0}
    assert parsed["drivers"]["WekaFS"]["gds"] is True
    assert "rdma_devices_not_configured" not in codes(gds.readiness(parsed, filesystem="WekaFS", rdma_dev_addrs=["10.0.0.1"]))


def test_rdma_devices_down_is_a_problem():
    parsed = gds.parse_gdscheck(text("gdscheck_rdma_configured_fragment.txt").replace("Down: 0", "Down: 2"))
    assert "rdma_devices_down" in codes(gds.readiness(parsed, filesystem="WekaFS", rdma_dev_addrs=["10.0.0.1"]))


def test_modes_format_nfs_p2pdma_compat_is_not_gds():
    parsed = gds.parse_gdscheck(text("gdscheck_modes_driver_config.txt"))
    assert parsed["format"] == "modes"
    assert parsed["drivers"]["NFS"] == {"status": "p2pdma, compat", "modes": ["p2pdma", "compat"], "gds": False, "compat": True}
    assert parsed["drivers"]["NVMeOF"]["gds"] is True  # p2pdma is a route for NVMe-oF
    assert parsed["drivers"]["NVMe"]["gds"] is False  # compat only
    assert "fs_unsupported" in codes(gds.readiness(parsed))


def test_modes_format_nvfs_is_gds():
    parsed = gds.parse_gdscheck(text("gdscheck_modes_driver_config_c2c.txt"))
    assert parsed["drivers"]["NVMe"]["modes"] == ["c2c", "nvfs", "compat"]
    assert parsed["drivers"]["NVMe"]["gds"] is True
    assert parsed["drivers"]["NVMeOF"]["gds"] is False


def test_not_gdscheck_output():
    assert codes(gds.readiness(gds.parse_gdscheck("bash: gdscheck: command not found\n"))) == ["gdscheck_output"]


def test_force_compat_and_failed_verification_and_unsupported_gpu():
    source = text("gdscheck_1.13.1.3_nfs_rdma_mount.txt")
    source = source.replace("force_compat_mode : false", "force_compat_mode : true")
    source = source.replace("verification succeeded", "verification failed")
    source = source.replace("supports GDS", "does not support GDS")
    problems = codes(gds.readiness(gds.parse_gdscheck(source), allow_compat=True))
    assert problems == ["compat_forced", "gpu_unsupported", "platform_verification"]


def test_nvfs_stats_io_stats_disabled():
    stats = gds.parse_nvfs_stats(text("nvidia_fs_stats_1.14_io_stats_disabled.txt"))
    assert stats["stats_version"] == "4.0" and stats["driver_version"] == "2.25.7"
    assert stats["io_stats"] is False
    assert stats["reads"] == {"err": 0, "io_state_err": 0}
    assert stats["errors"]["dma-ref"] == 0
    assert stats["gpus"][0]["pci"] == "0000:01:00.0" and stats["gpus"][0]["max_pinned_MiB"] == 1
    verdict = gds.gds_path_verdict(stats, stats)
    assert not verdict["ok"] and codes(verdict["causes"]) == ["io_stats_disabled"]


def test_nvfs_stats_nfs_client():
    stats = gds.parse_nvfs_stats(text("nvidia_fs_stats_nfs_client_io_stats.txt"))
    assert stats["io_stats"] is True  # no 'IO stats:' line in this older format, counts present
    assert stats["reads"]["n"] == 424436862 and stats["reads"]["mib"] == 21518771
    assert stats["writes"]["n"] == 309770912 and stats["writes"]["pg-cache"] == 0
    assert stats["shadow_buffer_mib"] == 128
    assert len(stats["gpus"]) == 2


def grown(stats, reads=0, writes=0, **extra):
    after = copy.deepcopy(stats)
    after["reads"]["n"] += reads
    after["writes"]["n"] += writes
    for (section, key), value in extra.items():
        after[section][key] = after[section].get(key, 0) + value
    return after


@pytest.fixture
def client():
    return gds.parse_nvfs_stats(text("nvidia_fs_stats_nfs_client_io_stats.txt"))


def test_verdict_ok_when_reads_and_writes_grow(client):
    verdict = gds.gds_path_verdict(client, grown(client, reads=10, writes=4))
    assert verdict == {"ok": True, "reads": 10, "writes": 4, "causes": []}


def test_verdict_no_growth_names_both(client):
    verdict = gds.gds_path_verdict(client, copy.deepcopy(client))
    assert codes(verdict["causes"]) == ["no_gds_reads", "no_gds_writes"]
    assert all(c["fix"] for c in verdict["causes"])


def test_verdict_read_only_probe(client):
    verdict = gds.gds_path_verdict(client, grown(client, reads=3), expect_writes=False)
    assert verdict["ok"]


def test_verdict_errors_page_cache_dma(client):
    after = grown(client, reads=5, writes=5)
    after["reads"]["err"] += 2
    after["writes"]["pg-cache"] += 7
    after["errors"]["dma-map"] += 1
    verdict = gds.gds_path_verdict(client, after)
    assert codes(verdict["causes"]) == ["gds_io_errors", "page_cache_writes", "dma_errors"]
    assert "reads err +2" in verdict["causes"][0]["what"]


def test_verdict_module_not_loaded(client):
    assert codes(gds.gds_path_verdict(client, None)["causes"]) == ["nvidia_fs_not_loaded"]


def test_cufile_stats_compat_io(client):
    cufile = gds.parse_cufile_stats(text("gds_stats_level3.txt"))
    assert cufile["version"] == "3"
    assert cufile["global"]["Total Read Size (MiB)"] == 78193
    assert cufile["gpus"][2]["read"]["n"] == 78193
    assert gds.cufile_compat_io(cufile) == {"reads": 0, "writes": 0}
    assert gds.gds_path_verdict(client, grown(client, reads=1, writes=1), cufile_stats=cufile)["ok"]
    posix = gds.parse_cufile_stats(text("gds_stats_level3.txt").replace("n=78193 posix=0", "n=78193 posix=12"))
    verdict = gds.gds_path_verdict(client, grown(client, reads=1, writes=1), cufile_stats=posix)
    assert codes(verdict["causes"]) == ["cufile_compat_io"]


def test_every_cause_has_what_and_fix():
    for code, (what, fix) in gds.FALLBACK_CAUSES.items():
        assert what and fix, code

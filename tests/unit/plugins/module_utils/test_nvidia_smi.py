"""Parsing of captured nvidia-smi outputs (tests/unit/fixtures/nvidia_smi)."""
import os

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import nvidia_smi as smi

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "nvidia_smi")


def fixture(name):
    with open(os.path.join(FIX, name)) as handle:
        return handle.read()


@pytest.mark.parametrize(
    "gpu,count,name,mem,driver,cc,arch,first_bus",
    [
        ("h100", 8, "NVIDIA H100 80GB HBM3", 81559, "570.172.08", "9.0", "hopper", "0000:18:00.0"),
        ("h200", 8, "NVIDIA H200", 143771, "580.82.07", "9.0", "hopper", "0000:18:00.0"),
        ("a100", 8, "NVIDIA A100-SXM4-80GB", 81920, "535.261.03", "8.0", "ampere", "0000:07:00.0"),
        ("l40s", 4, "NVIDIA L40S", 46068, "570.172.08", "8.9", "ada", "0000:4f:00.0"),
        ("v100", 2, "Tesla V100-SXM2-32GB", 32768, "535.261.03", "7.0", "volta", "0000:1a:00.0"),
    ],
)
def test_query_gpu(gpu, count, name, mem, driver, cc, arch, first_bus):
    gpus = smi.parse_query_gpu(fixture("%s_query_gpu.csv" % gpu))
    assert len(gpus) == count
    assert [g["index"] for g in gpus] == list(range(count))
    first = gpus[0]
    assert first["name"] == name
    assert first["memory_total_mib"] == mem
    assert first["driver_version"] == driver
    assert first["compute_capability"] == cc
    assert first["architecture"] == arch
    assert first["pci_bus_id"] == first_bus
    assert first["uuid"].startswith("GPU-") and len(first["uuid"]) == 40
    assert len(set(g["uuid"] for g in gpus)) == count


def test_query_gpu_legacy_fields_and_na():
    text = "0, Tesla P100-PCIE-16GB, GPU-1, 16384, 470.256.02, 00000000:3B:00.0\n"
    gpus = smi.parse_query_gpu(text, smi.QUERY_FIELDS_LEGACY)
    assert gpus[0]["compute_capability"] is None and gpus[0]["architecture"] is None
    text = "0, NVIDIA A100-SXM4-40GB, GPU-2, [N/A], 535.1, 00000000:07:00.0, 8.0\n"
    assert smi.parse_query_gpu(text)[0]["memory_total_mib"] is None


def test_query_gpu_rejects_wrong_shape():
    with pytest.raises(smi.NvidiaSmiParseError):
        smi.parse_query_gpu("0, NVIDIA H100, GPU-1\n")
    with pytest.raises(smi.NvidiaSmiParseError):
        smi.parse_query_gpu("x, NVIDIA H100, GPU-1, lots, 570.1, 00000000:18:00.0, 9.0\n")


def test_query_gpu_name_with_comma_is_rebuilt():
    gpus = smi.parse_query_gpu("0, Odd, Name, GPU-1, 1024, 570.1, 00000000:18:00.0, 9.0\n")
    assert gpus[0]["name"] == "Odd, Name"
    assert gpus[0]["uuid"] == "GPU-1"


@pytest.mark.parametrize(
    "gpu,driver,cuda,attached,fabric",
    [
        ("h100", "570.172.08", "12.8", 8, ["Completed"] * 8),
        ("h200", "580.82.07", "13.0", 8, ["Completed"] * 8),
        ("a100", "535.261.03", "12.2", 8, []),
        ("l40s", "570.172.08", "12.8", 4, [None] * 4),
    ],
)
def test_query(gpu, driver, cuda, attached, fabric):
    info = smi.parse_query(fixture("%s_query.txt" % gpu))
    assert info["driver_version"] == driver
    assert info["cuda_version"] == cuda
    assert info["attached_gpus"] == attached
    assert info["fabric_states"] == fabric


@pytest.mark.parametrize("gpu,nvlink,sample", [("h100", True, "NV18"), ("h200", True, "NV18"),
                                               ("a100", True, "NV12"), ("l40s", False, "NODE")])
def test_topology(gpu, nvlink, sample):
    topo = smi.parse_topology(fixture("%s_topo.txt" % gpu))
    assert topo["nvlink"] is nvlink
    assert topo["links"]["GPU0"]["GPU1"] == sample
    assert "GPU0" not in topo["links"]["GPU0"]
    assert not any(k.startswith("NIC") for k in topo["links"])


@pytest.mark.parametrize("name,status", [("no_devices.txt", "no_devices"), ("mismatch.txt", "version_mismatch"),
                                         ("driver_not_loaded.txt", "driver_not_loaded"),
                                         ("legacy_compute_cap.txt", None)])
def test_classify_failure(name, status):
    assert smi.classify_failure(fixture(name)) == status


@pytest.mark.parametrize("cc,arch", [("6.0", "pascal"), ("7.0", "volta"), ("7.5", "turing"), ("8.0", "ampere"),
                                     ("8.6", "ampere"), ("8.9", "ada"), ("9.0", "hopper"), ("10.0", "blackwell"),
                                     ("12.0", "blackwell"), ("", None), ("bogus", None), ("42.0", None)])
def test_architecture(cc, arch):
    assert smi.architecture_from_compute_cap(cc) == arch


def make_pci(tmp_path, devices):
    for addr, vendor, device, cls in devices:
        d = tmp_path / addr
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
        (d / "class").write_text(cls + "\n")
    return str(tmp_path)


def test_read_pci_devices_hgx_h100(tmp_path):
    root = make_pci(tmp_path, [
        ("0000:18:00.0", "0x10de", "0x2330", "0x030200"),   # H100 SXM5
        ("0000:05:00.0", "0x10de", "0x22a3", "0x068000"),   # NVSwitch (Hopper generation)
        ("0000:00:00.0", "0x8086", "0x09a2", "0x060000"),   # Intel host bridge: ignored
        ("0000:19:00.1", "0x10de", "0x22ba", "0x040300"),   # NVIDIA audio-class function
    ])
    devices = smi.read_pci_devices(root)
    kinds = {d["address"]: d["kind"] for d in devices}
    assert kinds == {"0000:05:00.0": "nvswitch", "0000:18:00.0": "gpu", "0000:19:00.1": "other"}
    gpu = [d for d in devices if d["kind"] == "gpu"][0]
    assert gpu["pre_turing"] is False and gpu["device_id"] == "0x2330"


def test_read_pci_devices_missing_root(tmp_path):
    assert smi.read_pci_devices(str(tmp_path / "nope")) == []


def test_pre_turing_from_pci_ids():
    assert smi.describe_pci_device("0000:1a:00.0", "0x1db5", "0x030200")["pre_turing"] is True   # V100
    assert smi.describe_pci_device("0000:1a:00.0", "0x15f8", "0x030200")["pre_turing"] is True   # P100
    assert smi.describe_pci_device("0000:1a:00.0", "0x1eb8", "0x030200")["pre_turing"] is False  # T4
    assert smi.describe_pci_device("0000:1a:00.0", "0x26b9", "0x030000")["pre_turing"] is False  # L40S
    assert smi.describe_pci_device("0000:1a:00.0", "zz", "0x030200")["pre_turing"] is None


def test_build_facts_h100():
    facts = smi.build_facts(
        query_gpu=smi.parse_query_gpu(fixture("h100_query_gpu.csv")),
        query=smi.parse_query(fixture("h100_query.txt")),
        topology=smi.parse_topology(fixture("h100_topo.txt")),
        nvidia_smi="/usr/bin/nvidia-smi",
    )
    assert facts["count"] == 8 and facts["status"] == "ok"
    assert facts["driver_version"] == "570.172.08" and facts["driver_branch"] == "570"
    assert facts["cuda_version"] == "12.8"
    assert facts["architectures"] == ["hopper"]
    assert facts["nvlink"] is True and facts["nvswitch"] is True
    assert facts["open_kernel_modules_supported"] is True
    assert facts["reboot_required"] is False and facts["nvidia_present"] is True


def test_build_facts_l40s_no_nvswitch():
    facts = smi.build_facts(query_gpu=smi.parse_query_gpu(fixture("l40s_query_gpu.csv")),
                            query=smi.parse_query(fixture("l40s_query.txt")),
                            topology=smi.parse_topology(fixture("l40s_topo.txt")))
    assert facts["nvlink"] is False and facts["nvswitch"] is False
    assert facts["architectures"] == ["ada"]


def test_build_facts_mixed_generations_refuse_open():
    gpus = smi.parse_query_gpu(fixture("v100_query_gpu.csv")) + smi.parse_query_gpu(fixture("l40s_query_gpu.csv"))
    facts = smi.build_facts(query_gpu=gpus)
    assert facts["architectures"] == ["volta", "ada"]
    assert facts["open_kernel_modules_supported"] is False


def test_build_facts_no_gpu_and_pci_only():
    empty = smi.build_facts(status="no_nvidia_smi")
    assert empty["count"] == 0 and empty["nvidia_present"] is False
    assert empty["open_kernel_modules_supported"] is None and empty["nvswitch"] is False
    pci = [smi.describe_pci_device("0000:1a:00.0", "0x1db5", "0x030200")]
    facts = smi.build_facts(pci_devices=pci, status="no_nvidia_smi")
    assert facts["nvidia_present"] is True and facts["pci_gpu_count"] == 1
    assert facts["open_kernel_modules_supported"] is False


def test_build_facts_mismatch_requires_reboot():
    facts = smi.build_facts(status="version_mismatch")
    assert facts["reboot_required"] is True and facts["count"] == 0

"""gpu_facts against a test double of nvidia-smi (a script that prints captured outputs
and records every call) and a fake sysfs PCI tree."""
import json
import os
import stat
import sys

import pytest

from ansible.module_utils.testing import patch_module_args
from ansible_collections.kvcache.offload.plugins.modules import gpu_facts

FIX = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "nvidia_smi"))

DOUBLE = r'''#!{python}
"""Test double for nvidia-smi: prints captured output for the scenario, records argv."""
import sys
scenario, fix, log = {scenario!r}, {fix!r}, {log!r}
with open(log, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
def out(name, rc=0):
    with open(fix + "/" + name) as handle:
        sys.stdout.write(handle.read())
    sys.exit(rc)
if scenario in ("no_devices", "mismatch", "driver_not_loaded"):
    out(scenario + ".txt", {{"no_devices": 6, "mismatch": 18, "driver_not_loaded": 9}}[scenario])
if scenario == "legacy" and args[0].startswith("--query-gpu") and "compute_cap" in args[0]:
    out("legacy_compute_cap.txt", 2)
if scenario == "legacy" and args[0].startswith("--query-gpu"):
    sys.stdout.write("0, Tesla P100-PCIE-16GB, GPU-1, 16384, 470.256.02, 00000000:3B:00.0\n")
    sys.exit(0)
if scenario == "garbage" and args[0].startswith("--query-gpu"):
    sys.stdout.write("this is not csv\n")
    sys.exit(0)
if scenario == "crash":
    sys.stderr.write("Unable to determine the device handle for GPU0000:18:00.0: Unknown Error\n")
    sys.exit(255)
if args[0].startswith("--query-gpu"):
    out(scenario + "_query_gpu.csv")
if args == ["-q"]:
    out(scenario + "_query.txt") if scenario != "legacy" else sys.exit(0)
if args == ["topo", "-m"]:
    out(scenario + "_topo.txt")
sys.exit(3)
'''


def make_double(tmp_path, scenario):
    log = tmp_path / "calls.log"
    path = tmp_path / "nvidia-smi"
    path.write_text(DOUBLE.format(python=sys.executable, scenario=scenario, fix=FIX, log=str(log)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path), log


def run(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exc:
            gpu_facts.main()
    result = json.loads(capsys.readouterr().out)
    return exc.value.code, result


def pci_tree(tmp_path, devices):
    root = tmp_path / "pci"
    root.mkdir()
    for addr, device, cls in devices:
        d = root / addr
        d.mkdir()
        (d / "vendor").write_text("0x10de\n")
        (d / "device").write_text(device + "\n")
        (d / "class").write_text(cls + "\n")
    return str(root)


def test_h100_hgx(tmp_path, capsys):
    binary, log = make_double(tmp_path, "h100")
    pci = pci_tree(tmp_path, [("0000:18:00.0", "0x2330", "0x030200"), ("0000:05:00.0", "0x22a3", "0x068000")])
    rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": pci, "_ansible_check_mode": True})
    assert rc == 0 and result["changed"] is False
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["status"] == "ok" and facts["count"] == 8
    assert facts["gpus"][7]["pci_bus_id"] == "0000:db:00.0"
    assert facts["cuda_version"] == "12.8" and facts["nvswitch"] and facts["nvswitch_count"] == 1
    assert facts["nvlink"] is True
    calls = log.read_text().splitlines()
    assert calls == [
        "--query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id,compute_cap --format=csv,noheader,nounits",
        "-q",
        "topo -m",
    ]


@pytest.mark.parametrize("gpu,count,arch", [("h200", 8, "hopper"), ("a100", 8, "ampere"), ("l40s", 4, "ada")])
def test_other_models(tmp_path, capsys, gpu, count, arch):
    binary, _log = make_double(tmp_path, gpu)
    _rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none")})
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["count"] == count and facts["architectures"] == [arch]
    assert facts["nvswitch"] is (gpu == "h200")


@pytest.mark.parametrize("scenario,status,reboot", [("no_devices", "no_devices", False),
                                                    ("mismatch", "version_mismatch", True),
                                                    ("driver_not_loaded", "driver_not_loaded", False)])
def test_failures_are_facts_not_errors(tmp_path, capsys, scenario, status, reboot):
    binary, log = make_double(tmp_path, scenario)
    rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none")})
    assert rc == 0 and not result.get("failed")
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["status"] == status and facts["count"] == 0 and facts["reboot_required"] is reboot
    assert len(log.read_text().splitlines()) == 1
    if reboot:
        assert "Reboot required" in facts["message"]


def test_legacy_driver_without_compute_cap(tmp_path, capsys):
    binary, log = make_double(tmp_path, "legacy")
    _rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none")})
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["count"] == 1 and facts["gpus"][0]["compute_capability"] is None
    calls = log.read_text().splitlines()
    assert "compute_cap" in calls[0] and "compute_cap" not in calls[1]


def test_unknown_error_is_reported(tmp_path, capsys):
    binary, _log = make_double(tmp_path, "crash")
    _rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none")})
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["status"] == "error" and "Unknown Error" in facts["message"]


def test_unparseable_output_fails(tmp_path, capsys):
    binary, _log = make_double(tmp_path, "garbage")
    rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none")})
    assert rc == 1 and result["failed"] and "Cannot parse" in result["msg"]


def test_no_nvidia_smi_but_gpu_on_pci(tmp_path, capsys):
    pci = pci_tree(tmp_path, [("0000:1a:00.0", "0x1db5", "0x030200")])
    _rc, result = run(capsys, {"nvidia_smi_path": str(tmp_path / "missing"), "pci_devices_path": pci})
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["status"] == "no_nvidia_smi" and facts["count"] == 0
    assert facts["nvidia_present"] is True and facts["open_kernel_modules_supported"] is False


def test_timeout_is_float_seconds_and_positive(tmp_path, capsys, monkeypatch):
    binary, _log = make_double(tmp_path, "crash")
    rc, result = run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none"), "timeout": 0})
    assert rc == 1 and result["failed"] and "timeout must be positive" in result["msg"]

    commands = []
    real = gpu_facts.AnsibleModule.run_command

    def recording(self, cmd, *args, **kwargs):
        commands.append(cmd)
        return real(self, cmd, *args, **kwargs)

    monkeypatch.setattr(gpu_facts.AnsibleModule, "run_command", recording)
    monkeypatch.setattr(gpu_facts.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    run(capsys, {"nvidia_smi_path": binary, "pci_devices_path": str(tmp_path / "none"), "timeout": 2.5})
    assert commands and commands[0][:3] == ["timeout", "2.5", binary]

# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse nvidia-smi output and NVIDIA PCI devices into structured GPU facts.

Pure functions on text (no subprocess, no Ansible), so captured outputs can be unit
tested and the module, preflight and the vllm role share one parser.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

# Fields for `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`, in order.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "driver_version",
    "pci.bus_id",
    "compute_cap",
)
# Drivers older than about R510 reject compute_cap; the module retries without it.
QUERY_FIELDS_LEGACY = QUERY_FIELDS[:-1]

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class codes (base class + subclass) of NVIDIA functions we care about.
PCI_CLASS_VGA = "0300"
PCI_CLASS_3D = "0302"
PCI_CLASS_BRIDGE_OTHER = "0680"  # how NVSwitch presents itself on the PCI bus

# First PCI device id of the Turing generation (TU102). Every earlier NVIDIA GPU
# (Maxwell, Pascal, Volta: P100 0x15f8, V100 0x1db4, ...) has a lower id, and the open
# GPU kernel modules support Turing and newer only.
FIRST_TURING_PCI_DEVICE_ID = 0x1E00

MISMATCH_MARKER = "Driver/library version mismatch"
NO_DEVICES_MARKER = "No devices were found"
NO_DRIVER_MARKERS = (
    "couldn't communicate with the NVIDIA driver",
    "NVIDIA driver is not loaded",
)

# CUDA compute capability (major) -> architecture; 7.5 and 7.2 split inside major 7.
_ARCH_BY_MAJOR = {
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    8: "ampere",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
}
ARCHITECTURES = (
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
)
OPEN_MODULES_ARCHITECTURES = ("turing", "ampere", "ada", "hopper", "blackwell")


class NvidiaSmiParseError(ValueError):
    """nvidia-smi printed something this parser does not understand."""


def architecture_from_compute_cap(compute_cap):
    """Return the architecture name for a compute capability like '9.0', or None."""
    if not compute_cap:
        return None
    match = re.match(r"^\s*(\d+)\.(\d+)\s*$", str(compute_cap))
    if not match:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8 and minor == 9:
        return "ada"
    return _ARCH_BY_MAJOR.get(major)


def open_modules_supported(architecture):
    """True when NVIDIA's open GPU kernel modules support this architecture."""
    return architecture in OPEN_MODULES_ARCHITECTURES


def _value(text):
    text = text.strip()
    if text in ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"):
        return None
    return text


def _int(text):
    text = _value(text)
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        raise NvidiaSmiParseError("not a number: %r" % text)


def parse_query_gpu(text, fields=QUERY_FIELDS):
    """Parse `--query-gpu=<fields> --format=csv,noheader,nounits` output.

    Returns a list of dicts, one per GPU, sorted by index. Names may contain commas
    only in theory (nvidia-smi does not quote them); the name field is rebuilt from
    the columns between uuid's neighbours when a line has too many columns.
    """
    gpus = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) > len(fields) and "name" in fields:
            extra = len(cols) - len(fields)
            pos = fields.index("name")
            cols[pos:pos + extra + 1] = [", ".join(cols[pos:pos + extra + 1])]
        if len(cols) != len(fields):
            raise NvidiaSmiParseError(
                "expected %d comma-separated fields (%s), got %d in line %r"
                % (len(fields), ",".join(fields), len(cols), line)
            )
        row = dict(zip(fields, cols))
        compute_cap = _value(row.get("compute_cap", ""))
        gpu = {
            "index": _int(row["index"]),
            "name": _value(row["name"]),
            "uuid": _value(row["uuid"]),
            "memory_total_mib": _int(row["memory.total"]),
            "driver_version": _value(row["driver_version"]),
            "pci_bus_id": normalize_pci_address(_value(row["pci.bus_id"])),
            "compute_capability": compute_cap,
            "architecture": architecture_from_compute_cap(compute_cap),
        }
        if gpu["index"] is None:
            raise NvidiaSmiParseError("GPU without an index in line %r" % line)
        gpus.append(gpu)
    return sorted(gpus, key=lambda g: g["index"])


def normalize_pci_address(address):
    """'00000000:18:00.0' (nvidia-smi) and '0000:18:00.0' (sysfs) -> '0000:18:00.0'."""
    if not address:
        return address
    match = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", address)
    if not match:
        return address.lower()
    domain = int(match.group(1), 16)
    return "%04x:%s:%s.%s" % (domain, match.group(2).lower(), match.group(3).lower(), match.group(4))


def parse_query(text):
    """Parse the header of `nvidia-smi -q`: driver version, CUDA version, GPU count,
    and the per-GPU Fabric state (present on NVSwitch-capable Hopper and newer)."""
    info = {"driver_version": None, "cuda_version": None, "attached_gpus": None, "fabric_states": []}
    for raw in text.splitlines():
        if ":" not in raw:
            continue
        key, _sep, value = raw.partition(":")
        key = key.strip()
        value = _value(value)
        if key == "Driver Version" and info["driver_version"] is None:
            info["driver_version"] = value
        elif key == "CUDA Version" and info["cuda_version"] is None:
            info["cuda_version"] = value
        elif key == "Attached GPUs" and info["attached_gpus"] is None:
            info["attached_gpus"] = _int(value or "")
    # The Fabric section: "    Fabric" then "        State   : Completed" lines.
    in_fabric = False
    fabric_indent = 0
    for raw in text.splitlines():
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if stripped == "Fabric":
            in_fabric, fabric_indent = True, indent
            continue
        if in_fabric:
            if stripped and indent <= fabric_indent:
                in_fabric = False
            elif stripped.startswith("State") and ":" in stripped:
                info["fabric_states"].append(_value(stripped.partition(":")[2]))
    return info


def parse_topology(text):
    """Parse `nvidia-smi topo -m`: the GPU-to-GPU link matrix.

    Returns {'nvlink': bool, 'links': {'GPU0': {'GPU1': 'NV18', ...}, ...}}. NVLink
    links show as NV<n> (n bonded links); PIX/PXB/PHB/NODE/SYS are PCIe paths.
    """
    links = {}
    header = None
    for raw in text.splitlines():
        if not raw.strip():
            continue
        cols = raw.split()
        if header is None:
            if cols and cols[0].startswith("GPU"):
                header = [c for c in cols if re.match(r"^GPU\d+$", c)]
            continue
        if not re.match(r"^GPU\d+$", cols[0]):
            if cols[0] in ("Legend:", "Legend"):
                break
            continue
        row = {}
        for peer, value in zip(header, cols[1:1 + len(header)]):
            if peer != cols[0]:
                row[peer] = value
        links[cols[0]] = row
    nvlink = any(re.match(r"^NV\d+$", v) for row in links.values() for v in row.values())
    return {"nvlink": nvlink, "links": links}


def classify_failure(text):
    """Map nvidia-smi's error text to a status word, or None if it is not an error we know."""
    if MISMATCH_MARKER in text:
        return "version_mismatch"
    if NO_DEVICES_MARKER in text:
        return "no_devices"
    for marker in NO_DRIVER_MARKERS:
        if marker in text:
            return "driver_not_loaded"
    return None


def read_pci_devices(root="/sys/bus/pci/devices"):
    """List NVIDIA PCI functions from sysfs: works before any driver is installed."""
    devices = []
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return devices
    for entry in entries:
        base = os.path.join(root, entry)
        try:
            with open(os.path.join(base, "vendor")) as handle:
                vendor = handle.read().strip().lower()
            if vendor != NVIDIA_PCI_VENDOR:
                continue
            with open(os.path.join(base, "device")) as handle:
                device = handle.read().strip().lower()
            with open(os.path.join(base, "class")) as handle:
                pci_class = handle.read().strip().lower()
        except (IOError, OSError):
            continue
        devices.append(describe_pci_device(entry, device, pci_class))
    return devices


def describe_pci_device(address, device, pci_class):
    """Classify one NVIDIA PCI function (device id and class as sysfs prints them)."""
    cls = pci_class[2:6] if pci_class.startswith("0x") else pci_class[:4]
    if cls in (PCI_CLASS_VGA, PCI_CLASS_3D):
        kind = "gpu"
    elif cls == PCI_CLASS_BRIDGE_OTHER:
        kind = "nvswitch"
    else:
        kind = "other"
    entry = {
        "address": normalize_pci_address(address),
        "device_id": device,
        "class": pci_class,
        "kind": kind,
        "pre_turing": None,
    }
    if kind == "gpu":
        try:
            entry["pre_turing"] = int(device, 16) < FIRST_TURING_PCI_DEVICE_ID
        except ValueError:
            entry["pre_turing"] = None
    return entry


def build_facts(query_gpu=None, query=None, topology=None, pci_devices=None,
                status="ok", nvidia_smi=None, message=""):
    """Assemble the gpu_facts dictionary the module returns (all inputs parsed)."""
    gpus = query_gpu or []
    query = query or {}
    topology = topology or {"nvlink": False, "links": {}}
    pci_devices = pci_devices or []
    pci_gpus = [d for d in pci_devices if d["kind"] == "gpu"]
    nvswitch_count = len([d for d in pci_devices if d["kind"] == "nvswitch"])
    fabric_states = [s for s in query.get("fabric_states", []) if s]
    architectures = sorted(set(g["architecture"] for g in gpus if g["architecture"]),
                           key=ARCHITECTURES.index)
    if architectures:
        open_ok = all(open_modules_supported(a) for a in architectures)
    elif pci_gpus and all(d["pre_turing"] is not None for d in pci_gpus):
        open_ok = not any(d["pre_turing"] for d in pci_gpus)
    else:
        open_ok = None
    driver_version = query.get("driver_version") or next(
        (g["driver_version"] for g in gpus if g["driver_version"]), None)
    return {
        "status": status,
        "message": message,
        "nvidia_smi": nvidia_smi,
        "count": len(gpus),
        "gpus": gpus,
        "driver_version": driver_version,
        "driver_branch": driver_version.split(".")[0] if driver_version else None,
        "cuda_version": query.get("cuda_version"),
        "architectures": architectures,
        "nvlink": bool(topology.get("nvlink")),
        "nvswitch": nvswitch_count > 0 or any(s != "N/A" for s in fabric_states),
        "nvswitch_count": nvswitch_count,
        "fabric_states": fabric_states,
        "topology": topology.get("links", {}),
        "pci_devices": pci_devices,
        "pci_gpu_count": len(pci_gpus),
        "nvidia_present": bool(pci_gpus) or bool(gpus),
        "open_kernel_modules_supported": open_ok,
        "reboot_required": status == "version_mismatch",
    }

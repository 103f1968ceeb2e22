#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts from nvidia-smi and the PCI bus
version_added: "0.1.0"
description:
  - Reads the NVIDIA PCI functions from sysfs (GPUs and NVSwitches; works before any driver is installed).
  - Runs C(nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id,compute_cap
    --format=csv,noheader,nounits), C(nvidia-smi -q) and C(nvidia-smi topo -m) when C(nvidia-smi) exists,
    and returns index, name, memory, driver and CUDA version, architecture, NVLink and NVSwitch presence.
  - A host without C(nvidia-smi) or without devices is not an error, it has C(count=0).
  - Detects C(Driver/library version mismatch) (kernel module and user-space libraries of different
    versions, typically after a driver upgrade without reboot) and reports C(reboot_required=true).
  - Changes nothing; runs the same in check mode.
author:
  - kvcache.offload contributors (@kvcache-offload)
options:
  nvidia_smi_path:
    description:
      - Path of C(nvidia-smi). When not set, it is looked up on C(PATH) and in C(/usr/bin).
    type: path
  pci_devices_path:
    description:
      - Directory listing the host's PCI functions.
    type: path
    default: /sys/bus/pci/devices
  timeout:
    description:
      - Seconds each C(nvidia-smi) call may take.
    type: float
    default: 30.0
  topology:
    description:
      - Also run C(nvidia-smi topo -m) for the NVLink matrix.
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
notes:
  - NVSwitch presence comes from the PCI bus (NVIDIA functions of class 0x0680) or a
    C(Fabric) state in C(nvidia-smi -q); NVLink from C(NV<n>) entries in C(nvidia-smi topo -m).
  - Parsing lives in C(kvcache.offload.nvidia_smi) module_utils, shared with other roles.
"""

EXAMPLES = r"""
- name: Gather GPU facts
  kvcache.offload.gpu_facts:

- name: Show how many GPUs the host has
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_facts.count }} GPU(s), driver {{ ansible_facts.gpu_facts.driver_version }}"

- name: Stop when the host needs a reboot after a driver upgrade
  ansible.builtin.assert:
    that: not ansible_facts.gpu_facts.reboot_required
    fail_msg: "{{ ansible_facts.gpu_facts.message }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    gpu_facts:
      description: What the host has.
      type: complex
      returned: always
      contains:
        status:
          description:
            - C(ok), C(no_nvidia_smi), C(no_devices), C(driver_not_loaded), C(version_mismatch) or C(error).
          type: str
          sample: ok
        message:
          description: Human-readable explanation of a status other than C(ok).
          type: str
          sample: ""
        nvidia_smi:
          description: Path of the nvidia-smi used, or null.
          type: str
          sample: /usr/bin/nvidia-smi
        count:
          description: Number of GPUs nvidia-smi lists (0 without nvidia-smi or devices).
          type: int
          sample: 8
        gpus:
          description: One entry per GPU, by index.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA H100 80GB HBM3
              uuid: GPU-4b1e4f29-9f5b-6c2d-8a4e-0c3d2b1a9f80
              memory_total_mib: 81559
              driver_version: 570.172.08
              pci_bus_id: "0000:18:00.0"
              compute_capability: "9.0"
              architecture: hopper
        driver_version:
          description: Driver version nvidia-smi reports.
          type: str
          sample: 570.172.08
        driver_branch:
          description: Major part of the driver version.
          type: str
          sample: "570"
        cuda_version:
          description: Highest CUDA version the driver supports (from nvidia-smi -q).
          type: str
          sample: "12.8"
        architectures:
          description: GPU architectures present, oldest first.
          type: list
          elements: str
          sample: [hopper]
        nvlink:
          description: Whether any GPU pair is linked by NVLink.
          type: bool
        nvswitch:
          description: Whether the host has NVSwitches (Fabric Manager needed).
          type: bool
        nvswitch_count:
          description: NVSwitch PCI functions found.
          type: int
        fabric_states:
          description: Fabric state per GPU from nvidia-smi -q (Hopper and newer), N/A entries dropped.
          type: list
          elements: str
        topology:
          description: GPU-to-GPU link matrix from nvidia-smi topo -m.
          type: dict
        pci_devices:
          description: NVIDIA PCI functions (address, device_id, class, kind gpu/nvswitch/other, pre_turing).
          type: list
          elements: dict
        pci_gpu_count:
          description: NVIDIA GPUs on the PCI bus, whether or not a driver is loaded.
          type: int
        nvidia_present:
          description: Whether the host has any NVIDIA GPU.
          type: bool
        open_kernel_modules_supported:
          description:
            - Whether every GPU is Turing or newer (open GPU kernel modules), null when unknown.
          type: bool
        reboot_required:
          description: Kernel module and libraries differ (Driver/library version mismatch).
          type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kvcache.offload.plugins.module_utils.nvidia_smi import (
    QUERY_FIELDS,
    QUERY_FIELDS_LEGACY,
    NvidiaSmiParseError,
    build_facts,
    classify_failure,
    parse_query,
    parse_query_gpu,
    parse_topology,
    read_pci_devices,
)
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import timeout_spec

MESSAGES = {
    "no_nvidia_smi": "nvidia-smi is not installed: no NVIDIA driver on this host.",
    "no_devices": "nvidia-smi found no NVIDIA devices.",
    "driver_not_loaded": "nvidia-smi cannot talk to the NVIDIA kernel module: the driver is not loaded.",
    "version_mismatch": (
        "Driver/library version mismatch: the loaded NVIDIA kernel module and the installed "
        "libraries differ (usually a driver upgrade without reboot). Reboot required."
    ),
}


def run_smi(module, binary, args):
    """Run nvidia-smi with a timeout; returns (rc, combined output)."""
    cmd = ["timeout", "%g" % module.params["timeout"], binary] + args
    if not module.get_bin_path("timeout"):
        cmd = [binary] + args
    rc, out, err = module.run_command(cmd, environ_update={"LC_ALL": "C"})
    return rc, out, err


def find_nvidia_smi(module):
    path = module.params["nvidia_smi_path"]
    if path:
        return path if os.access(path, os.X_OK) else None
    return module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/nvidia/bin"])


def gather(module):
    pci = read_pci_devices(module.params["pci_devices_path"])
    binary = find_nvidia_smi(module)
    if not binary:
        return build_facts(pci_devices=pci, status="no_nvidia_smi", message=MESSAGES["no_nvidia_smi"])

    fields = QUERY_FIELDS
    rc, out, err = run_smi(module, binary, ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    if rc != 0 and "compute_cap" in (out + err) and "not a valid field" in (out + err):
        fields = QUERY_FIELDS_LEGACY
        rc, out, err = run_smi(module, binary, ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
    if rc != 0:
        status = classify_failure(out + err)
        if status is None:
            return build_facts(pci_devices=pci, status="error", nvidia_smi=binary,
                               message="nvidia-smi failed (rc=%d): %s" % (rc, (err or out).strip()))
        return build_facts(pci_devices=pci, status=status, nvidia_smi=binary, message=MESSAGES[status])
    try:
        gpus = parse_query_gpu(out, fields)
    except NvidiaSmiParseError as exc:
        module.fail_json(msg="Cannot parse nvidia-smi --query-gpu output: %s" % exc, stdout=out)
    if not gpus:
        return build_facts(pci_devices=pci, status="no_devices", nvidia_smi=binary, message=MESSAGES["no_devices"])

    rc, out, err = run_smi(module, binary, ["-q"])
    query = parse_query(out) if rc == 0 else None
    topology = None
    if module.params["topology"] and len(gpus) > 1:
        rc, out, err = run_smi(module, binary, ["topo", "-m"])
        topology = parse_topology(out) if rc == 0 else None
    return build_facts(query_gpu=gpus, query=query, topology=topology, pci_devices=pci,
                       status="ok", nvidia_smi=binary)


def argument_spec():
    spec = dict(
        nvidia_smi_path=dict(type="path"),
        pci_devices_path=dict(type="path", default="/sys/bus/pci/devices"),
        topology=dict(type="bool", default=True),
    )
    spec.update(timeout_spec(30.0))
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    if module.params["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive")
    facts = gather(module)
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: mountstats
short_description: Check a live NFS mount against what was asked, from /proc/self/mountstats
version_added: 0.1.0
description:
  - Reads C(/proc/self/mountstats) on the node and reports the NFS version, transport (C(tcp) or C(rdma)),
    number of transports (nconnect), rsize/wsize and pNFS layout of the mount on O(path).
  - Fails when the path is not an NFS mount or when the live mount differs from what was asked, for example
    NFSv3 where 4.1 was asked, or TCP where RDMA was asked (the kernel falls back silently when C(rpcrdma) is missing
    or the LIF has no RDMA).
  - Reads only; changes nothing.
author:
  - kvcache.offload contributors (@kvcache-offload)
options:
  path:
    description: Mount point to check.
    type: path
    required: true
  vers:
    description: NFS version the mount must use (C(4.1), C(4.2), C(3), ...). Not checked when omitted.
    type: str
  proto:
    description: Transport every connection of the mount must use. Not checked when omitted.
    type: str
    choices: [tcp, rdma]
  nconnect:
    description: Number of transports the mount must have. Not checked when omitted.
    type: int
  rsize:
    description: Read size the mount must have. Not checked when omitted (the server may lower it).
    type: int
  wsize:
    description: Write size the mount must have. Not checked when omitted (the server may lower it).
    type: int
  sec:
    description:
      - Security flavour the mount must use (the kernel's C(sec=) option), e.g. C(krb5p) where the export is meant to
        be reached with Kerberos privacy only. Not checked when omitted.
    type: str
    choices: [sys, krb5, krb5i, krb5p]
  require_pnfs:
    description: Fail unless the NFSv4 line names a pNFS layout type.
    type: bool
    default: false
  mountstats_file:
    description: File to read. Only tests change it.
    type: path
    default: /proc/self/mountstats
requirements:
  - Linux with an NFS client (the file exists only there).
notes:
  - The node must have read the mount at least once; C(/proc/self/mountstats) lists the mounts of the caller's mount namespace.
extends_documentation_fragment:
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: Fail unless the KV cache volume is NFSv4.1 over RDMA with pNFS
  kvcache.offload.mountstats:
    path: /mnt/kvcache
    vers: "4.1"
    proto: rdma
    require_pnfs: true

- name: Report what a mount uses without checking anything
  kvcache.offload.mountstats:
    path: /mnt/kvcache
  register: live
"""

RETURN = r"""
mount:
  description: What the live mount uses.
  returned: when the path is mounted
  type: dict
  contains:
    device:
      description: Server and export.
      type: str
      sample: 10.20.0.5:/kvcache
    fstype:
      description: C(nfs) or C(nfs4).
      type: str
      sample: nfs4
    vers:
      description: NFS version.
      type: str
      sample: "4.1"
    proto:
      description: Transport of the mount.
      type: str
      sample: rdma
    transports:
      description: Number of C(xprt) lines (connections).
      type: int
      sample: 1
    nconnect:
      description: C(nconnect) option (1 when absent).
      type: int
      sample: 1
    rsize:
      description: Negotiated read size.
      type: int
      sample: 262144
    wsize:
      description: Negotiated write size.
      type: int
      sample: 262144
    pnfs:
      description: pNFS layout type, or null.
      type: str
      sample: LAYOUT_NFSV4_1_FILES
    sec:
      description: Security flavour (C(sec=) option), or null.
      type: str
      sample: sys
    sessions:
      description: Whether NFSv4.1 sessions are in use.
      type: bool
      sample: true
    opts:
      description: Every mount option the kernel reports.
      type: dict
problems:
  description: Differences between the live mount and what was asked; empty when it matches.
  returned: always
  type: list
  elements: str
  sample: ["transport is tcp, asked for rdma"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kvcache.offload.plugins.module_utils import mountstats as ms


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            vers=dict(type="str"),
            proto=dict(type="str", choices=["tcp", "rdma"]),
            nconnect=dict(type="int"),
            rsize=dict(type="int"),
            wsize=dict(type="int"),
            require_pnfs=dict(type="bool", default=False),
            sec=dict(type="str", choices=["sys", "krb5", "krb5i", "krb5p"]),
            mountstats_file=dict(type="path", default="/proc/self/mountstats"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["mountstats_file"]) as handle:
            text = handle.read()
    except (IOError, OSError) as exc:
        module.fail_json(msg="Cannot read %s: %s" % (p["mountstats_file"], exc), problems=["cannot read mountstats"])

    mount = ms.find(ms.parse(text), p["path"])
    if mount is None:
        module.fail_json(
            msg="%s is not a mount point (no entry in %s). Fix: mount the NFS export there first." % (p["path"], p["mountstats_file"]),
            problems=["not mounted"],
        )
    facts = ms.summary(mount)
    problems = ms.compare(
        mount, vers=p["vers"], proto=p["proto"], nconnect=p["nconnect"],
        rsize=p["rsize"], wsize=p["wsize"], require_pnfs=p["require_pnfs"], sec=p["sec"],
    )
    if problems:
        module.fail_json(
            msg="The live mount on %s (%s) is not what was asked: %s. Fix: check the client modules (rpcrdma for RDMA), "
                "the server's protocol settings (NFSv4.1, pNFS, RDMA on the LIF) and remount."
                % (p["path"], facts["device"], "; ".join(problems)),
            mount=facts, problems=problems,
        )
    module.exit_json(changed=False, mount=facts, problems=[])


if __name__ == "__main__":
    main()

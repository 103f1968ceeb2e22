# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""nfs_kernel_problems: NFS mount options a node's kernel does not know."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: nfs_kernel_problems
short_description: The NFS mount options a kernel does not know (it would refuse the whole mount)
version_added: 0.1.0
description:
  - Takes a mount option string (or list) and a kernel release as C(ansible_facts.kernel) reports it, and returns one
    entry per option the kernel does not know. The Linux NFS client refuses a mount with an option it does not know
    (C(mount.nfs - an incorrect mount option was specified)), so each entry is a mount that would fail.
  - Knows C(trunkdiscovery)/C(notrunkdiscovery) (Linux 5.18; Red Hat backported it to RHEL 9's 5.14 in
    C(5.14.0-170.el9)) and C(write=lazy|eager|wait) (Linux 5.12). Other options are not judged.
  - A kernel release that cannot be read (empty, no C(major.minor)) gives no entry.
positional: kernel
options:
  _input:
    description: The mount options, as a comma-separated string or a list.
    type: raw
    required: true
  kernel:
    description: The kernel release, e.g. C(5.15.0-91-generic) or C(5.14.0-427.13.1.el9_4.x86_64).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Options the node's kernel does not know
  ansible.builtin.debug:
    msg: "{{ 'vers=4.1,trunkdiscovery,write=eager' | kvcache.offload.nfs_kernel_problems('5.15.0-91-generic') }}"
# [{"option": "trunkdiscovery", "kernel": "5.15.0-91-generic", "requires": "Linux 5.18 or later (RHEL 9:
#   5.14.0-170.el9 or later)", ...}]
"""

RETURN = r"""
_value:
  description: One entry per unknown option - C(option), C(kernel), C(requires) (the kernels that know it) and C(source).
  type: list
  elements: dict
"""

import re

from ansible.module_utils.six import string_types

# Option name (before '=') -> first upstream kernel that parses it, RHEL backports
# ({RHEL major: first kernel build number "5.14.0-<build>" with it}) and the source.
#
# trunkdiscovery: upstream commit a43bf6044464 "NFSv4.1 provide mount option to toggle trunking
#   discovery" (Olga Kornievskaia, committed 2022-03-21, merged for 5.18; adds
#   NFS_MOUNT_TRUNK_DISCOVERY, https://git.zx2c4.com/linux-dev/commit/include?id=a43bf604446414103b7535f38e739b65601c4fb2).
#   (The kernel commits are the sources here: the release each was merged for.)
#   RHEL 9 backported the same commit in kernel-5.14.0-170.el9 (changelog: "NFSv4.1 provide mount
#   option to toggle trunking discovery (Scott Mayhew) [2066372]",
#   https://gitlab.com/clrkwllms/kernel/-/tags/kernel-5.14.0-170.el9), so RHEL 9.2+ kernels
#   (5.14.0-284 and later, e.g. 9.4's 5.14.0-427.13.1.el9_4) know it and 9.0/9.1 (5.14.0-70, -162) do not.
# write=lazy|eager|wait: upstream commit a0492339fc70 "NFS: Add mount options supporting eager
#   writes" (Trond Myklebust, committed 2021-02-16, merged for 5.12,
#   https://git.zx2c4.com/linux-dev/commit/?id=ed7bcdb374d20fab9e9dc36853a6735c047ad1b1 is its
#   companion "NFS: Add support for eager writes"). RHEL 9's 5.14 base already has it.
OPTION_KERNELS = {
    "trunkdiscovery": {"upstream": (5, 18), "rhel": {9: 170},
                       "source": "Linux commit a43bf6044464 (5.18); RHEL 9 kernel-5.14.0-170.el9 (rhbz#2066372)"},
    "notrunkdiscovery": {"upstream": (5, 18), "rhel": {9: 170},
                         "source": "Linux commit a43bf6044464 (5.18); RHEL 9 kernel-5.14.0-170.el9 (rhbz#2066372)"},
    "write": {"upstream": (5, 12), "rhel": {},
              "source": "Linux commit a0492339fc70 (5.12)"},
}

_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")
# RHEL family (RHEL, Rocky, Alma, CentOS Stream): 5.14.0-427.13.1.el9_4.x86_64 -> build 427, RHEL 9.
_RHEL = re.compile(r"^\s*\d+\.\d+\.\d+-(\d+)(?:\.[0-9_]+)*\.el(\d+)")


def _option_names(options):
    if isinstance(options, string_types):
        options = options.split(",")
    names = []
    for option in options or []:
        option = str(option).strip()
        if option:
            names.append(option.split("=", 1)[0].strip())
    return names


def _requires(rule):
    text = "Linux %d.%d or later" % rule["upstream"]
    backports = ["RHEL %d: 5.14.0-%d.el%d or later" % (major, build, major) for major, build in sorted(rule["rhel"].items())]
    return text + (" (%s)" % "; ".join(backports) if backports else "")


def kernel_knows(kernel, name):
    """True/False when the kernel release does/does not know option NAME; None when it cannot be told."""
    rule = OPTION_KERNELS.get(name)
    if rule is None:
        return True
    match = _RELEASE.match(kernel or "")
    if not match:
        return None
    version = (int(match.group(1)), int(match.group(2)))
    if version >= rule["upstream"]:
        return True
    rhel = _RHEL.match(kernel)
    if rhel:
        build, major = int(rhel.group(1)), int(rhel.group(2))
        if major in rule["rhel"]:
            return build >= rule["rhel"][major]
    return False


def nfs_kernel_problems(options, kernel):
    """One entry per option in OPTIONS that KERNEL does not know."""
    problems = []
    for name in _option_names(options):
        if kernel_knows(kernel, name) is False:
            rule = OPTION_KERNELS[name]
            problems.append({
                "option": name,
                "kernel": kernel,
                "requires": _requires(rule),
                "source": rule["source"],
            })
    return problems


class FilterModule(object):
    """kvcache.offload NFS client filters."""

    def filters(self):
        return {"nfs_kernel_problems": nfs_kernel_problems}

# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse /proc/self/mountstats and compare a live NFS mount with what was asked.

Shared by the ``mountstats`` module and its unit tests. Standard library only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

NFS_FSTYPES = ("nfs", "nfs4")


def _split_opts(text):
    """'rw,vers=4.1,proto=rdma' -> {'rw': True, 'vers': '4.1', 'proto': 'rdma'}."""
    opts = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            key, value = item.split("=", 1)
            opts[key] = value
        else:
            opts[item] = True
    return opts


def parse(text):
    """Parse the text of /proc/self/mountstats.

    Returns a list of dicts, one per mount, in file order. Every mount has
    ``device``, ``mountpoint``, ``fstype``; NFS mounts also have ``statvers``,
    ``opts`` (dict), ``nfsv4`` (dict, NFSv4 only), ``caps`` (dict) and
    ``xprts`` (list of dicts with ``proto`` and the raw counters).
    """
    mounts = []
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if raw.startswith("device "):
            # device SRV:/path mounted on /mnt with fstype nfs4 statvers=1.1
            words = line.split()
            try:
                on = words.index("on")
                with_idx = words.index("with", on)
            except ValueError:
                current = None
                continue
            current = {
                "device": " ".join(words[1:on - 1]),
                "mountpoint": " ".join(words[on + 1:with_idx]).replace("\\040", " "),
                "fstype": words[with_idx + 2] if len(words) > with_idx + 2 else "",
                "statvers": None,
                "opts": {},
                "nfsv4": {},
                "caps": {},
                "xprts": [],
            }
            for word in words[with_idx + 3:]:
                if word.startswith("statvers="):
                    current["statvers"] = word.split("=", 1)[1]
            mounts.append(current)
            continue
        if current is None or ":" not in line:
            continue
        key, dummy, value = line.partition(":")
        key = key.strip()
        value = value.strip()
        if key == "opts":
            current["opts"] = _split_opts(value)
        elif key == "nfsv4":
            current["nfsv4"] = _split_opts(value)
        elif key == "caps":
            current["caps"] = _split_opts(value)
        elif key == "xprt":
            fields = value.split()
            if fields:
                current["xprts"].append({"proto": fields[0], "counters": fields[1:]})
    return mounts


def find(mounts, mountpoint):
    """The last mount on ``mountpoint`` (the one on top when mounts are stacked)."""
    path = mountpoint.rstrip("/") or "/"
    found = None
    for mount in mounts:
        if (mount["mountpoint"].rstrip("/") or "/") == path:
            found = mount
    return found


def _norm_vers(value):
    value = str(value).strip()
    if value in ("4", "4.0"):
        return "4.0"
    return value


def summary(mount):
    """The facts a caller cares about, from one parsed mount."""
    opts = mount.get("opts", {})
    xprt_protos = [x["proto"] for x in mount.get("xprts", [])]
    proto = opts.get("proto") or (xprt_protos[0] if xprt_protos else None)
    vers = opts.get("vers")
    if vers is None and mount.get("fstype") == "nfs4":
        vers = "4.0"
    pnfs = mount.get("nfsv4", {}).get("pnfs")
    return {
        "device": mount.get("device"),
        "mountpoint": mount.get("mountpoint"),
        "fstype": mount.get("fstype"),
        "vers": _norm_vers(vers) if vers is not None else None,
        "proto": proto,
        "transports": len(xprt_protos),
        "transport_protos": xprt_protos,
        "nconnect": int(opts["nconnect"]) if str(opts.get("nconnect", "")).isdigit() else 1,
        "rsize": int(opts["rsize"]) if str(opts.get("rsize", "")).isdigit() else None,
        "wsize": int(opts["wsize"]) if str(opts.get("wsize", "")).isdigit() else None,
        "pnfs": pnfs if pnfs and pnfs != "not configured" else None,
        "sec": opts.get("sec"),
        "sessions": bool(mount.get("nfsv4", {}).get("sessions")),
        "opts": opts,
    }


def compare(mount, vers=None, proto=None, nconnect=None, rsize=None, wsize=None, require_pnfs=False, sec=None):
    """Differences between a parsed mount and what was asked, as readable strings.

    An empty list means the live mount is what was asked. ``None`` skips a check.
    """
    if mount is None:
        return ["not mounted"]
    facts = summary(mount)
    problems = []
    if facts["fstype"] not in NFS_FSTYPES:
        problems.append("fstype is %s, not NFS" % facts["fstype"])
        return problems
    if vers is not None and facts["vers"] != _norm_vers(vers):
        problems.append("NFS version is %s, asked for %s" % (facts["vers"], _norm_vers(vers)))
    if proto is not None:
        if facts["proto"] != proto:
            problems.append("transport is %s, asked for %s" % (facts["proto"], proto))
        wrong = sorted(set(p for p in facts["transport_protos"] if p != proto))
        if wrong and facts["proto"] == proto:
            problems.append("some transports use %s, asked for %s" % (", ".join(wrong), proto))
    if nconnect is not None and facts["nconnect"] != int(nconnect):
        problems.append("nconnect is %s, asked for %s" % (facts["nconnect"], nconnect))
    if rsize is not None and facts["rsize"] != int(rsize):
        problems.append("rsize is %s, asked for %s" % (facts["rsize"], rsize))
    if wsize is not None and facts["wsize"] != int(wsize):
        problems.append("wsize is %s, asked for %s" % (facts["wsize"], wsize))
    if sec is not None and facts["sec"] != sec:
        problems.append("security flavour is %s, asked for %s" % (facts["sec"], sec))
    if require_pnfs and not facts["pnfs"]:
        problems.append("pNFS is not in use (no layout type in the nfsv4 line)")
    return problems

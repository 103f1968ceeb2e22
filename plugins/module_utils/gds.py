# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsers and verdicts for NVIDIA GPUDirect Storage (GDS): gdscheck -p, nvidia-fs stats, gds_stats.

Formats (captures in tests/unit/fixtures/gds, sources in its SOURCES.md):

- ``gdscheck -p`` (GDS 1.0 ... 1.13): sections ENVIRONMENT, DRIVER CONFIGURATION (``NFS : Supported``
  or ``Unsupported``; ``--rdma library : Loaded (libcufile_rdma.so)`` / ``Not Loaded``; ``--rdma devices :
  Configured`` / ``Not configured``; ``--rdma_device_status : Up: N Down: M``), CUFILE CONFIGURATION
  (``properties.use_compat_mode : true``, ...), GPU INFO (``GPU index 0 <name> bar:1 bar size (MiB):N
  supports GDS, IOMMU State: Disabled``), PLATFORM INFO.
- NVIDIA's newer tooling (2026) prints the data paths per storage type instead:
  ``NFS : p2pdma, compat`` or ``NVMe : c2c, nvfs, compat``. ``compat`` is the POSIX fallback;
  ``nvfs`` is the nvidia-fs path; ``p2pdma`` counts only for NVMe and NVMe-oF (NVIDIA's own checker
  reports ``NFS: p2pdma, compat`` as an unsupported P2PDMA token, not an active route).
- ``/proc/driver/nvidia-fs/stats``: written by NVIDIA/gds-nvidia-fs src/nvfs-stat.c. ``Reads``/``Writes``
  carry ``n= ok= err= readMiB=`` only with the module parameter ``rw_stats_enabled=1``; otherwise only
  ``err= io_state_err=`` (so counters that do not grow prove nothing unless IO stats are enabled).
- ``gds_stats -p PID -l 3`` (cuFile STATS VERSION 3): PER_GPU STATS lines count ``posix=`` I/O, the
  reads and writes cuFile served in compat mode (POSIX) instead of GDS.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Data paths of the newer DRIVER CONFIGURATION format that move data without a CPU bounce buffer.
DIRECT_MODES = ("nvfs", "c2c", "p2pdma")
# Storage types on which NVIDIA's checker counts p2pdma as an active route.
P2PDMA_TYPES = ("NVMe", "NVMeOF")

_SECTIONS = {
    "ENVIRONMENT:": "environment",
    "DRIVER CONFIGURATION:": "driver",
    "CUFILE CONFIGURATION:": "cufile",
    "GPU INFO:": "gpu",
    "PLATFORM INFO:": "platform",
}
_GPU_RE = re.compile(
    r"^GPU index (?P<index>\d+) (?P<name>.+?) bar:(?P<bar>\d+) bar size \(MiB\):(?P<bar_mib>\d+)\s*(?P<rest>.*)$")
_VERSIONS_RE = re.compile(r"nvidia_fs version:\s*(?P<nvfs>\S+)\s+libcufile version:\s*(?P<cufile>\S+)")


def _clean(line):
    """One line without the decorations people publish captures with (a '# ' prefix, indentation)."""
    line = line.rstrip("\n").strip()
    if line.startswith("#"):
        line = line[1:].strip()
    return line


def to_bool(value):
    """true/false/1/0 as gdscheck prints them, None for anything else."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "enabled"):
        return True
    if text in ("false", "0", "no", "disabled"):
        return False
    return None


def _driver_entry(name, value):
    status = value.strip()
    if status in ("Supported", "Unsupported"):
        return {"status": status, "modes": [], "gds": status == "Supported", "compat": None}
    modes = [m.strip() for m in status.split(",") if m.strip()]
    direct = [m for m in modes if m in DIRECT_MODES and (m != "p2pdma" or name in P2PDMA_TYPES)]
    return {"status": status, "modes": modes, "gds": bool(direct), "compat": "compat" in modes}


def parse_gdscheck(text):
    """Parse the output of ``gdscheck -p`` (both formats). Returns a dict; ``format`` is None when
    the text has no DRIVER CONFIGURATION section (not gdscheck output, or gdscheck failed early)."""
    out = {
        "format": None,
        "gds_release": None,
        "nvidia_fs_version": None,
        "libcufile_version": None,
        "drivers": {},
        "rdma": {"peerdirect": None, "library_loaded": None, "devices_configured": None,
                 "devices_up": None, "devices_down": None},
        "properties": {},
        "gpus": [],
        "platform": {"iommu": None, "driver_status": None, "open_driver": None,
                     "cuda_driver_version": None, "verification": None, "warnings": []},
    }
    section = None
    for raw in text.splitlines():
        line = _clean(raw)
        if not line or set(line) <= set("=."):
            continue
        if line in _SECTIONS:
            section = _SECTIONS[line]
            if section == "driver" and out["format"] is None:
                out["format"] = "status"
            continue
        if line.startswith("GDS release version:"):
            out["gds_release"] = line.split(":", 1)[1].strip()
            continue
        match = _VERSIONS_RE.search(line)
        if match:
            out["nvidia_fs_version"] = match.group("nvfs")
            out["libcufile_version"] = match.group("cufile")
            continue
        if section == "driver":
            _driver_line(out, line)
        elif section == "cufile":
            key, sep, value = line.partition(":")
            if sep:
                out["properties"][key.strip()] = value.strip()
        elif section == "gpu":
            gpu = _GPU_RE.match(line)
            if gpu:
                rest = gpu.group("rest")
                iommu = rest.split("IOMMU State:", 1)[1].strip() if "IOMMU State:" in rest else None
                out["gpus"].append({
                    "index": int(gpu.group("index")), "name": gpu.group("name"),
                    "bar_mib": int(gpu.group("bar_mib")),
                    "supports_gds": rest.startswith("supports GDS"), "iommu": iommu,
                })
        elif section == "platform":
            _platform_line(out["platform"], line)
    if out["drivers"] and any(d["modes"] for d in out["drivers"].values()):
        out["format"] = "modes"
    return out


def _driver_line(out, line):
    key, sep, value = line.partition(":")
    if not sep:
        return
    key, value = key.strip(), value.strip()
    rdma = out["rdma"]
    if key == "--Mellanox PeerDirect":
        rdma["peerdirect"] = to_bool(value)
    elif key == "--rdma library":
        rdma["library_loaded"] = value.startswith("Loaded")
    elif key == "--rdma devices":
        rdma["devices_configured"] = value == "Configured"
    elif key == "--rdma_device_status":
        up = re.search(r"Up:\s*(\d+)", value)
        down = re.search(r"Down:\s*(\d+)", value)
        rdma["devices_up"] = int(up.group(1)) if up else None
        rdma["devices_down"] = int(down.group(1)) if down else None
    elif not key.startswith("--"):
        out["drivers"][key] = _driver_entry(key, value)


def _platform_line(platform, line):
    if line.startswith("IOMMU:"):
        platform["iommu"] = line.split(":", 1)[1].strip()
    elif line.startswith("WARN:"):
        platform["warnings"].append(line.split(":", 1)[1].strip())
    elif line.startswith("Nvidia Driver Info Status:"):
        status = line.split(":", 1)[1].strip()
        platform["driver_status"] = status
        platform["open_driver"] = "Open Driver" in status
    elif line.startswith("Cuda Driver Version Installed:"):
        platform["cuda_driver_version"] = line.split(":", 1)[1].strip()
    elif line.startswith("Platform verification"):
        platform["verification"] = "succeeded" if "succeeded" in line else "failed"


def compat_mode(properties):
    """Whether cuFile may (or must) fall back to POSIX I/O. gdscheck prints the setting as
    properties.use_compat_mode (cufile.json calls it properties.allow_compat_mode);
    properties.force_compat_mode forces POSIX for every I/O."""
    allowed = None
    for key in ("properties.allow_compat_mode", "properties.use_compat_mode"):
        if key in properties:
            allowed = to_bool(properties[key])
            break
    return {"allowed": allowed, "forced": to_bool(properties.get("properties.force_compat_mode", "false"))}


def _problem(code, what, fix):
    return {"code": code, "what": what, "fix": fix}


def readiness(parsed, filesystem="NFS", rdma_dev_addrs=None, allow_compat=False):
    """What keeps GDS from carrying the KV tier, as a list of {code, what, fix}; [] when ready.

    rdma_dev_addrs: the addresses cufile.json lists (properties.rdma_dev_addr_list). An NFS mount over
    RDMA needs none (the kernel's NFS client does the RDMA; the captured 1.13.1.3 output shows NFS
    Supported with 'rdma devices: Not configured'); when some are listed, cuFile must have them up."""
    problems = []
    if parsed is None or parsed.get("format") is None:
        return [_problem("gdscheck_output", "gdscheck -p printed no DRIVER CONFIGURATION section",
                         "install the GDS tools (gds-tools / nvidia-gds) and run gdscheck -p by hand to see why")]
    if not parsed.get("nvidia_fs_version"):
        problems.append(_problem("nvidia_fs_not_loaded", "gdscheck reports no nvidia_fs version (module not loaded)",
                                 "install nvidia-fs for the running kernel and modprobe nvidia_fs"))
    entry = parsed["drivers"].get(filesystem)
    if entry is None:
        problems.append(_problem("fs_not_listed", "gdscheck lists no %s driver" % filesystem,
                                 "use a GDS release that supports %s (NFS over RDMA: GDS 1.0 and later)" % filesystem))
    elif not entry["gds"]:
        problems.append(_problem(
            "fs_unsupported", "%s : %s (no GDS path, only POSIX)" % (filesystem, entry["status"]),
            "load rpcrdma and nvidia_fs, mount the volume with proto=rdma, and use an RDMA stack NVIDIA supports "
            "for NFS (nvidia-fs: NFS over RDMA with MOFED 5.1 and later)"))
    modes = compat_mode(parsed["properties"])
    if modes["forced"]:
        problems.append(_problem("compat_forced", "properties.force_compat_mode is true: every cuFile I/O is POSIX",
                                 "set properties.force_compat_mode false in /etc/cufile.json"))
    if modes["allowed"] and not allow_compat:
        problems.append(_problem(
            "compat_allowed", "compat mode is on (properties.use_compat_mode/allow_compat_mode true): a missing GDS "
            "path falls back to POSIX silently", "set properties.allow_compat_mode false in /etc/cufile.json (gds_allow_compat_mode)"))
    rdma = parsed["rdma"]
    if rdma_dev_addrs:
        if not rdma["devices_configured"]:
            problems.append(_problem(
                "rdma_devices_not_configured",
                "cufile.json lists RDMA addresses %s but gdscheck says rdma devices: Not configured" % ", ".join(rdma_dev_addrs),
                "list addresses that an RDMA device on this node carries (ibdev2netdev / ip addr), or none for plain NFS over RDMA"))
        elif rdma["devices_down"]:
            problems.append(_problem("rdma_devices_down", "%s RDMA device(s) of cufile.json are down" % rdma["devices_down"],
                                     "bring the RDMA links up (ibstat) or remove their addresses"))
    for gpu in parsed["gpus"]:
        if not gpu["supports_gds"]:
            problems.append(_problem("gpu_unsupported", "GPU index %d (%s) does not support GDS" % (gpu["index"], gpu["name"]),
                                     "GDS needs a data-center GPU with a large BAR1"))
    platform = parsed["platform"]
    if platform["driver_status"] and not platform["driver_status"].startswith("Supported"):
        problems.append(_problem("driver_unsupported", "Nvidia Driver Info Status: %s" % platform["driver_status"],
                                 "install NVIDIA's open GPU kernel modules (nvidia_driver_kernel_modules: open)"))
    if platform["verification"] == "failed":
        problems.append(_problem("platform_verification", "gdscheck: Platform verification failed",
                                 "read the WARN/ERR lines of gdscheck -p"))
    return problems


# --- /proc/driver/nvidia-fs/stats ------------------------------------------------------------

_NVFS_GPU_RE = re.compile(r"^GPU (?P<pci>\S+)\s+uuid:(?P<uuid>\S+)\s*:\s*(?P<rest>.*)$")
_KV_RE = re.compile(r"([A-Za-z_%()/-]+)=([^\s]+)")


def _counters(text):
    values = {}
    for key, value in _KV_RE.findall(text):
        try:
            values[key] = int(value)
        except ValueError:
            values[key] = value
    return values


def parse_nvfs_stats(text):
    """Parse /proc/driver/nvidia-fs/stats. Counter lines become dicts of their key=value pairs, with
    readMiB/readMB and writeMiB/writeMB both as 'mib'. io_stats is None on formats without the line."""
    out = {"gds_version": None, "stats_version": None, "driver_version": None, "peerdirect": None,
           "io_stats": None, "peer_io_stats": None, "shadow_buffer_mib": None, "active_process": None,
           "reads": {}, "writes": {}, "sparse_reads": {}, "batches": {}, "mmap": {}, "bar1_map": {},
           "errors": {}, "ops": {}, "gpus": []}
    names = {"Reads": "reads", "Writes": "writes", "Sparse Reads": "sparse_reads", "Batches": "batches",
             "Mmap": "mmap", "Bar1-map": "bar1_map", "Error": "errors", "Ops": "ops"}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        gpu = _NVFS_GPU_RE.match(line)
        if gpu:
            entry = {"pci": gpu.group("pci"), "uuid": gpu.group("uuid")}
            entry.update(_counters(gpu.group("rest")))
            out["gpus"].append(entry)
            continue
        if line.startswith("GDS Version:"):
            out["gds_version"] = line.split(":", 1)[1].strip()
        elif line.startswith("NVFS statistics(ver:"):
            out["stats_version"] = line.split(":", 1)[1].strip(" )")
        elif line.startswith("NVFS Driver(version:"):
            out["driver_version"] = line.split(":", 1)[1].strip(" )")
        elif line.startswith("Mellanox PeerDirect Supported:"):
            out["peerdirect"] = to_bool(line.split(":", 1)[1].strip())
        elif line.startswith("IO stats:"):
            parts = dict(p.strip().split(":", 1) for p in line.split(",") if ":" in p)
            out["io_stats"] = to_bool(parts.get("IO stats", "").strip())
            out["peer_io_stats"] = to_bool(parts.get("peer IO stats", "").strip())
        elif line.startswith("Active Shadow-Buffer"):
            out["shadow_buffer_mib"] = int(line.rsplit(":", 1)[1].strip())
        elif line.startswith("Active Process:"):
            out["active_process"] = int(line.split(":", 1)[1].strip())
        else:
            key, sep, rest = line.partition(":")
            name = names.get(key.strip())
            if sep and name:
                out[name].update(_counters(rest))
    for name, mib_keys in (("reads", ("readMiB", "readMB")), ("writes", ("writeMiB", "writeMB"))):
        for key in mib_keys:
            if key in out[name]:
                out[name]["mib"] = out[name][key]
    if out["io_stats"] is None and "n" in out["reads"]:
        # Older formats have no 'IO stats:' line; counts are there only when IO stats are on.
        out["io_stats"] = True
    return out


def _delta(before, after, section, key):
    if before is None:
        return None
    old = (before.get(section) or {}).get(key)
    new = (after.get(section) or {}).get(key)
    if not isinstance(old, int) or not isinstance(new, int):
        return None
    return new - old


# --- gds_stats -p PID -l 3 -------------------------------------------------------------------

_CUFILE_GPU_RE = re.compile(r"^GPU (?P<gpu>\d+) Read: (?P<read>.*?) Write: (?P<write>.*?)(?: BufRegister: (?P<reg>.*))?$")


def parse_cufile_stats(text):
    """Parse gds_stats output (cuFile STATS). posix= in PER_GPU STATS counts compat-mode (POSIX) I/O."""
    out = {"version": None, "global": {}, "gpus": []}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("cuFile STATS VERSION"):
            out["version"] = line.split(":", 1)[1].strip()
        elif line.endswith(":") and line.isupper() or line in ("GLOBAL STATS:", "PER_GPU STATS:"):
            section = line[:-1]
        elif section == "GLOBAL STATS" and ":" in line:
            key, value = line.split(":", 1)
            try:
                out["global"][key.strip()] = float(value.strip()) if "." in value else int(value.strip())
            except ValueError:
                out["global"][key.strip()] = value.strip()
        elif section == "PER_GPU STATS":
            gpu = _CUFILE_GPU_RE.match(line)
            if gpu:
                out["gpus"].append({"gpu": int(gpu.group("gpu")), "read": _counters(gpu.group("read")),
                                    "write": _counters(gpu.group("write"))})
    return out


def cufile_compat_io(cufile_stats):
    """Reads and writes cuFile served through POSIX (compat mode), summed over the GPUs."""
    reads = sum(g["read"].get("posix", 0) for g in cufile_stats["gpus"])
    writes = sum(g["write"].get("posix", 0) for g in cufile_stats["gpus"])
    return {"reads": reads, "writes": writes}


# --- the validation's verdict ----------------------------------------------------------------

FALLBACK_CAUSES = {
    "nvidia_fs_not_loaded": (
        "/proc/driver/nvidia-fs/stats does not exist: the nvidia_fs module is not loaded, so no I/O can take the GDS path",
        "run the gds role (it installs nvidia-fs for the driver branch and loads nvidia_fs); check dkms status"),
    "io_stats_disabled": (
        "nvidia-fs IO stats are disabled (rw_stats_enabled=0): its read/write counters cannot show the GDS path",
        "set gds_nvfs_rw_stats: true (the gds role writes options nvidia_fs rw_stats_enabled=1) or echo 1 > "
        "/sys/module/nvidia_fs/parameters/rw_stats_enabled"),
    "no_gds_reads": (
        "nvidia-fs read counters did not grow during the probe: the KV reads did not go through GDS (compat/POSIX "
        "I/O, a hit in LMCache's CPU tier, or an LMCache GDS backend that disabled GDS on this file system)",
        "check gdscheck -p (NFS must be Supported / nvfs), the mount (proto=rdma), cufile.log, and that the probe "
        "reads from the fs tier (lmcache local_cpu off for the probe)"),
    "no_gds_writes": (
        "nvidia-fs write counters did not grow during the probe: KV writes did not go through GDS",
        "as for reads; also check that gds_path is on the RDMA mount and cuFile did not log 'compat mode'"),
    "gds_io_errors": (
        "nvidia-fs counted read/write errors during the probe",
        "read dmesg (nvidia-fs) and cufile.log; a mount over TCP or an unsupported NFS client fails GDS I/O"),
    "page_cache_writes": (
        "nvidia-fs counted writes through the page cache (pg-cache) during the probe: buffered, not direct, I/O",
        "the NFS client took the buffered path; check the mount options and that the file is opened O_DIRECT"),
    "dma_errors": (
        "nvidia-fs counted DMA mapping errors during the probe",
        "IOMMU on (GDS wants iommu=off or pt), or GPU and NIC behind different root complexes; see gdscheck -p"),
    "cufile_compat_io": (
        "cuFile served reads or writes through POSIX (gds_stats posix= > 0): compat mode carried the I/O",
        "set properties.allow_compat_mode false so this is an error, and fix what gdscheck -p names"),
}


def _cause(code, detail=""):
    what, fix = FALLBACK_CAUSES[code]
    return {"code": code, "what": what + (" (%s)" % detail if detail else ""), "fix": fix}


def gds_path_verdict(before, after, cufile_stats=None, expect_reads=True, expect_writes=True):
    """Did the probe's KV reads and writes take the GDS path? before/after: parse_nvfs_stats of the
    node around the probe (after None: nvidia-fs not loaded). cufile_stats: parse_cufile_stats of
    the engine, when gds_stats could read it. Returns {ok, reads, writes, causes}."""
    causes = []
    if after is None:
        return {"ok": False, "reads": None, "writes": None, "causes": [_cause("nvidia_fs_not_loaded")]}
    reads = _delta(before, after, "reads", "n")
    writes = _delta(before, after, "writes", "n")
    if not after.get("io_stats"):
        causes.append(_cause("io_stats_disabled"))
    else:
        if expect_reads and (reads or 0) <= 0:
            causes.append(_cause("no_gds_reads", "reads n +%s" % (reads if reads is not None else "?")))
        if expect_writes and (writes or 0) <= 0:
            causes.append(_cause("no_gds_writes", "writes n +%s" % (writes if writes is not None else "?")))
    errors = [(s, k, _delta(before, after, s, k)) for s, k in
              (("reads", "err"), ("reads", "io_state_err"), ("writes", "err"), ("writes", "io_state_err"))]
    grown = ["%s %s +%d" % (s, k, d) for s, k, d in errors if d]
    if grown:
        causes.append(_cause("gds_io_errors", ", ".join(grown)))
    pg_cache = _delta(before, after, "writes", "pg-cache")
    if pg_cache:
        causes.append(_cause("page_cache_writes", "pg-cache +%d" % pg_cache))
    dma = [(k, _delta(before, after, "errors", k)) for k in ("dma-map", "dma-ref", "sg-ext", "cpu-gpu-pages")]
    dma_grown = ["%s +%d" % (k, d) for k, d in dma if d]
    if dma_grown:
        causes.append(_cause("dma_errors", ", ".join(dma_grown)))
    if cufile_stats is not None:
        posix = cufile_compat_io(cufile_stats)
        if posix["reads"] or posix["writes"]:
            causes.append(_cause("cufile_compat_io", "posix reads %d, writes %d" % (posix["reads"], posix["writes"])))
    return {"ok": not causes, "reads": reads, "writes": writes, "causes": causes}

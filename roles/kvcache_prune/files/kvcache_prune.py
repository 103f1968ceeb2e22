# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvcache_prune: keep a shared KV-cache volume (the fs tier) inside its watermarks.

LMCache never evicts from a remote tier, so an fs tier grows until the volume is full.
This pruner removes cache entries least recently used first until the tier is below a
size watermark (max_bytes) and/or the volume has a free-space watermark
(min_free_percent) free again. It never touches:

- temporary and partial files: names matching the exclude patterns (LMCache 0.5.6 writes
  ``<key>.tmp`` next to the final ``<key>.data``, or into ``relative_tmp_dir``, and renames
  it when complete; its GDS backend writes ``<file>.tmp<8 hex digits>`` and renames it; NFS
  ``.nfsXXXX`` silly-rename files and ONTAP's ``.snapshot`` are
  hidden names, excluded too);
- entries younger than the grace period (by mtime and ctime: a rename updates ctime, so a
  just-completed write is young), and, when access times are used, entries read within it.

"Last used" is max(atime, mtime) when the file system records access times, else mtime
(time_source "auto" reads the mount options: noatime means mtime). relatime updates
atime at most once a day per file unless it was modified, so LRU order is per day there.

Units: "file" (LMCache: each ``*.data`` file is one chunk; LMCache's GDS backend writes each
chunk as ``<key>.kvcache.safetensors`` plus its index ``<key>.kvcache.safetensors.metadata``
under two hash-named directory levels: the companion suffix ``.metadata`` makes the two one
entry, sized and dated together and removed together, index first) or "directory" (each direct
subdirectory of the root is one entry, removed as a whole: vLLM's ExampleConnector keeps
one directory of per-layer files per prompt, and a partial entry is worse than none).

Output: one line per removed entry ("removed ..." or, in dry-run mode, "would remove ...")
and a final JSON summary line on stdout (journald when run by systemd); the summary is
also appended to summary_file when one is given. With metrics_file, each run that was not
skipped also replaces that file (written beside it, then renamed) with the tier's fill and the
run's results in Prometheus' text format, for node_exporter's textfile collector: tier bytes and
entries left, the watermarks, the volume's size and free space, what the run removed, its
errors, whether the watermarks hold, and when it ran (the alert rules' inputs).

Exit status: 0 when the watermarks hold afterwards (or nothing had to go), 3 when they
still do not hold (everything left is young or excluded: the tier is undersized),
1 on a usage or configuration error. Another pruner holding the lock is not an error.

Standard library only; runs on Python 3.6+.

Usage: python3 kvcache_prune.py --config /etc/kvcache/prune.json [--dry-run]
       python3 kvcache_prune.py --path DIR --max-bytes N [--min-free-percent P] ...
"""

from __future__ import absolute_import, division, print_function

import argparse
import errno
import fnmatch
import json
import os
import shutil
import stat
import sys
import time

__metaclass__ = type

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_WATERMARK_NOT_MET = 3

LOCK_NAME = ".kvcache-prune.lock"

DEFAULTS = {
    "path": "/mnt/kvcache",
    "max_bytes": 0,
    "min_free_percent": 0.0,
    "grace_seconds": 600,
    "unit": "file",
    "include": ["*.data", "*.kvcache.safetensors"],
    "companions": [".metadata"],
    "exclude": ["*.tmp", "*.tmp????????", "*.part", "*.partial", "*.lock", "*~", ".*"],
    "time_source": "auto",
    "dry_run": False,
    "max_seconds": 0,
    "summary_file": "",
    "metrics_file": "",
    "log_each": True,
}

# name: (HELP text, summary key or a function of the summary). Gauges, labelled with the tier's path.
METRICS = (
    ("kvcache_prune_last_run_timestamp_seconds", "When the pruner's last run ended (Unix time).", "finished_at"),
    ("kvcache_prune_watermark_met", "1 when the watermarks held after the last run, 0 when the tier is still too full.",
     lambda s: 1 if s["watermark_met"] else 0),
    ("kvcache_prune_errors", "Entries the last run failed to remove.", "errors"),
    ("kvcache_prune_removed_entries", "Entries the last run removed (would remove, in a dry run).", "removed_entries"),
    ("kvcache_prune_removed_bytes", "Bytes the last run removed (would remove, in a dry run).", "removed_bytes"),
    ("kvcache_prune_dry_run", "1 when the last run only reported what it would remove.", lambda s: 1 if s["dry_run"] else 0),
    ("kvcache_prune_duration_seconds", "How long the last run took.", "duration_seconds"),
    ("kvcache_tier_bytes", "Bytes of cache entries on the tier after the last run.", "remaining_bytes"),
    ("kvcache_tier_entries", "Cache entries on the tier after the last run.", lambda s: s["scanned_entries"] - s["removed_entries"]),
    ("kvcache_tier_max_bytes", "The tier's size watermark (0: none).", "max_bytes"),
    ("kvcache_tier_min_free_ratio", "The volume's free-space watermark, as a ratio (0: none).", lambda s: s["min_free_percent"] / 100.0),
    ("kvcache_tier_volume_size_bytes", "Size of the volume that holds the tier.", "volume_bytes"),
    ("kvcache_tier_volume_avail_bytes", "Free space on the volume after the last run.", "volume_avail_bytes_after"),
)


class PruneError(Exception):
    """A configuration or usage error (exit status 1)."""


def _matches(name, rel, patterns):
    for pattern in patterns:
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(rel, pattern):
            return True
    return False


def mount_options(path, mountinfo="/proc/self/mountinfo"):
    """Mount point and options (a set) of the file system holding path, or (None, set())."""
    try:
        real = os.path.realpath(path)
        best, best_opts = None, set()
        with open(mountinfo) as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 6:
                    continue
                point = fields[4].replace("\\040", " ")
                opts = set(fields[5].split(","))
                if "-" in fields:
                    sep = fields.index("-")
                    if len(fields) > sep + 3:
                        opts |= set(fields[sep + 3].split(","))
                if real == point or real.startswith(point.rstrip("/") + "/") or point == "/":
                    if best is None or len(point) >= len(best):
                        best, best_opts = point, opts
        return best, best_opts
    except (IOError, OSError):
        return None, set()


def resolve_time_source(time_source, path, mountinfo="/proc/self/mountinfo"):
    """'atime' or 'mtime': what "last used" is measured by."""
    if time_source in ("atime", "mtime"):
        return time_source
    if time_source != "auto":
        raise PruneError("time_source must be auto, atime or mtime, got %r" % (time_source,))
    _point, opts = mount_options(path, mountinfo)
    if "noatime" in opts:
        return "mtime"
    return "atime"


class Entry:
    """One prunable unit: a file (with its companion files), or a directory of files removed as a whole."""

    __slots__ = ("path", "rel", "size", "last_used", "newest_change", "newest_access", "is_dir", "companions")

    def __init__(self, path, rel, size, last_used, newest_change, newest_access, is_dir=False, companions=()):
        self.path = path
        self.rel = rel
        self.size = size
        self.last_used = last_used
        self.newest_change = newest_change
        self.newest_access = newest_access
        self.is_dir = is_dir
        self.companions = list(companions)  # paths removed before path (an index before its data)


def _entry_from_stats(path, rel, stats, use_atime, is_dir=False, companions=()):
    size = 0
    last_used = 0.0
    newest_change = 0.0
    newest_access = 0.0
    for st in stats:
        is_directory = stat.S_ISDIR(st.st_mode)
        if not is_directory:
            size += st.st_size  # file data only: a directory's own size is file-system noise
        change = max(st.st_mtime, st.st_ctime)
        newest_change = max(newest_change, change)
        if is_directory:
            # Listing a directory (ls, du, a backup, this pruner's own walk) sets its atime:
            # that is not a use of the cache entry. Only reads of its files are.
            last_used = max(last_used, st.st_mtime)
            continue
        newest_access = max(newest_access, st.st_atime)
        used = max(st.st_atime, st.st_mtime) if use_atime else st.st_mtime
        last_used = max(last_used, used)
    return Entry(path, rel, size, last_used, newest_change, newest_access, is_dir, companions)


def _companion_of(name, rel, include, companions):
    """The suffix when name is <an included name><suffix> (a companion file), else None."""
    for suffix in companions:
        if suffix and name.endswith(suffix) and len(name) > len(suffix):
            main, main_rel = name[:-len(suffix)], rel[:-len(suffix)]
            if _matches(main, main_rel, include):
                return suffix
    return None


def scan(root, unit="file", include=None, exclude=None, use_atime=True, companions=None):
    """Return (entries, skipped) for root. skipped counts excluded (temporary) names.

    companions: suffixes; with unit "file", <entry><suffix> in the entry's directory belongs to
    the entry (its size and times count, it is removed with it, first). A companion whose entry
    is gone (a run stopped between the two removals) is an entry of its own.
    """
    include = DEFAULTS["include"] if include is None else include
    exclude = DEFAULTS["exclude"] if exclude is None else exclude
    companions = DEFAULTS["companions"] if companions is None else companions
    entries = []
    skipped = {"excluded": 0, "not_included": 0, "incomplete_dirs": 0}
    if unit == "file":
        for dirpath, dirnames, filenames in os.walk(root):
            reldir = os.path.relpath(dirpath, root)
            keep = []
            for d in dirnames:
                rel = d if reldir == "." else os.path.join(reldir, d)
                if _matches(d, rel, exclude):
                    skipped["excluded"] += 1
                else:
                    keep.append(d)
            dirnames[:] = sorted(keep)
            present = set(filenames)
            for name in sorted(filenames):
                rel = name if reldir == "." else os.path.join(reldir, name)
                if _matches(name, rel, exclude):
                    skipped["excluded"] += 1
                    continue
                suffix = _companion_of(name, rel, include, companions)
                if suffix is not None and name[:-len(suffix)] in present:
                    continue  # counted with its entry below
                if suffix is None and not _matches(name, rel, include):
                    skipped["not_included"] += 1
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue  # removed meanwhile
                if not stat.S_ISREG(st.st_mode):
                    continue
                stats, parts = [st], []
                for extra in companions if suffix is None else ():
                    if extra and name + extra in present and not _matches(name + extra, rel + extra, exclude):
                        try:
                            extra_st = os.lstat(path + extra)
                        except OSError:
                            continue
                        if stat.S_ISREG(extra_st.st_mode):
                            stats.append(extra_st)
                            parts.append(path + extra)
                entries.append(_entry_from_stats(path, rel, stats, use_atime, companions=parts))
    elif unit == "directory":
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if _matches(name, name, exclude):
                skipped["excluded"] += 1
                continue
            if not _matches(name, name, include):
                skipped["not_included"] += 1
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                skipped["not_included"] += 1
                continue
            stats = [st]
            incomplete = False
            for dirpath, _dirnames, filenames in os.walk(path):
                for fname in filenames:
                    frel = os.path.relpath(os.path.join(dirpath, fname), root)
                    if _matches(fname, frel, exclude):
                        incomplete = True  # a write into this entry is in flight
                    try:
                        stats.append(os.lstat(os.path.join(dirpath, fname)))
                    except OSError:
                        continue
            if incomplete:
                skipped["incomplete_dirs"] += 1
                continue
            entries.append(_entry_from_stats(path, name, stats, use_atime, is_dir=True))
    else:
        raise PruneError("unit must be file or directory, got %r" % (unit,))
    return entries, skipped


def plan(entries, now, max_bytes=0, min_free_percent=0.0, grace_seconds=0,
         fs_total=0, fs_avail=0, use_atime=True):
    """Decide what to remove. Pure: no file system access.

    Returns a dict: to_remove (entries, least recently used first), young (count),
    total_bytes, need_bytes (bytes that must go to meet both watermarks).
    """
    total = sum(e.size for e in entries)
    need = 0
    if max_bytes and max_bytes > 0:
        need = max(need, total - max_bytes)
    if min_free_percent and min_free_percent > 0 and fs_total > 0:
        want_free = int(fs_total * min_free_percent / 100.0 + 0.5)
        need = max(need, want_free - fs_avail)
    young = 0
    candidates = []
    for e in entries:
        is_young = now - e.newest_change < grace_seconds
        if use_atime and now - e.newest_access < grace_seconds:
            is_young = True
        if is_young:
            young += 1
        else:
            candidates.append(e)
    candidates.sort(key=lambda e: (e.last_used, e.rel))
    to_remove = []
    freed = 0
    if need > 0:
        for e in candidates:
            if freed >= need:
                break
            to_remove.append(e)
            freed += e.size
    return {"to_remove": to_remove, "young": young, "total_bytes": total,
            "need_bytes": max(need, 0), "planned_bytes": freed}


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _remove(entry):
    if entry.is_dir:
        shutil.rmtree(entry.path)
        return
    # The companions (an index such as GDS's .metadata) first: a reader that finds no index
    # does not look for the data; data without its index is invisible and goes next.
    for path in entry.companions:
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
    os.unlink(entry.path)


def _statvfs(path):
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


class _Lock:
    """Non-blocking exclusive lock in the root (serialises pruners sharing a volume)."""

    def __init__(self, root):
        self.path = os.path.join(root, LOCK_NAME)
        self.handle = None

    def acquire(self):
        import fcntl  # pylint: disable=import-outside-toplevel
        try:
            self.handle = open(self.path, "a")
        except (IOError, OSError) as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return None  # cannot lock here; prune without it
            raise
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError):
            self.handle.close()
            self.handle = None
            return False
        return True

    def release(self):
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def prune(config, out=None, now=None, statvfs=None, clock=None, mountinfo="/proc/self/mountinfo"):
    """Run one pruning pass. Returns (exit_status, summary dict)."""
    out = sys.stdout if out is None else out
    clock = time.time if clock is None else clock
    statvfs = _statvfs if statvfs is None else statvfs
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in config.items() if v is not None})
    root = cfg["path"]
    started = clock()
    now = started if now is None else now
    if not os.path.isdir(root):
        raise PruneError("path %s is not a directory (is the shared volume mounted?)" % root)
    if cfg["max_bytes"] < 0 or not 0 <= float(cfg["min_free_percent"]) < 100:
        raise PruneError("max_bytes must be >= 0 and min_free_percent in [0, 100)")
    if not cfg["max_bytes"] and not float(cfg["min_free_percent"]):
        raise PruneError("no watermark: set max_bytes and/or min_free_percent")
    time_source = resolve_time_source(cfg["time_source"], root, mountinfo)
    use_atime = time_source == "atime"
    summary = {
        "event": "kvcache_prune", "path": root, "dry_run": bool(cfg["dry_run"]),
        "unit": cfg["unit"], "time_source": time_source, "grace_seconds": cfg["grace_seconds"],
        "max_bytes": cfg["max_bytes"], "min_free_percent": float(cfg["min_free_percent"]),
    }
    lock = _Lock(root)
    locked = lock.acquire() if not cfg["dry_run"] else None
    if locked is False:
        summary.update({"skipped": "another pruner holds %s" % lock.path, "removed_entries": 0,
                        "removed_bytes": 0, "watermark_met": None})
        _emit(summary, cfg, out)
        return EXIT_OK, summary
    try:
        fs_total, fs_avail = statvfs(root)
        entries, skipped = scan(root, cfg["unit"], cfg["include"], cfg["exclude"], use_atime, cfg["companions"])
        decision = plan(entries, now, cfg["max_bytes"], float(cfg["min_free_percent"]),
                        cfg["grace_seconds"], fs_total, fs_avail, use_atime)
        removed, removed_bytes, errors, timed_out = 0, 0, 0, False
        verb = "would remove" if cfg["dry_run"] else "removed"
        for entry in decision["to_remove"]:
            if cfg["max_seconds"] and clock() - started > cfg["max_seconds"]:
                timed_out = True
                break
            if not cfg["dry_run"]:
                try:
                    _remove(entry)
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        errors += 1
                        out.write("error removing %s: %s\n" % (entry.path, exc))
                    continue
            removed += 1
            removed_bytes += entry.size
            if cfg["log_each"]:
                out.write("%s %s bytes=%d last_used=%s\n" % (verb, entry.rel, entry.size, _iso(entry.last_used)))
        remaining = decision["total_bytes"] - removed_bytes
        ended = clock()
        met = removed_bytes >= decision["need_bytes"]
        summary.update({
            "scanned_entries": len(entries), "scanned_bytes": decision["total_bytes"],
            "excluded": skipped["excluded"], "not_included": skipped["not_included"],
            "incomplete_dirs": skipped["incomplete_dirs"], "young_entries": decision["young"],
            "volume_bytes": fs_total, "volume_avail_bytes_before": fs_avail,
            "need_bytes": decision["need_bytes"], "removed_entries": removed,
            "removed_bytes": removed_bytes, "remaining_bytes": remaining, "errors": errors,
            "timed_out": timed_out, "watermark_met": met,
            "oldest_kept_last_used": None, "duration_seconds": round(ended - started, 3),
            "volume_avail_bytes_after": statvfs(root)[1], "finished_at": round(ended, 3),
        })
        gone = set(id(e) for e in decision["to_remove"][:removed])
        kept = [e.last_used for e in entries if id(e) not in gone]
        if kept:
            summary["oldest_kept_last_used"] = _iso(min(kept))
    finally:
        lock.release()
    _emit(summary, cfg, out)
    if errors:
        return EXIT_ERROR, summary
    return (EXIT_OK if met else EXIT_WATERMARK_NOT_MET), summary


def _label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(summary):
    """The run's summary in Prometheus' text exposition format (one gauge per METRICS row)."""
    lines = []
    labels = '{path="%s"}' % _label(summary["path"])
    for name, help_text, source in METRICS:
        value = source(summary) if callable(source) else summary[source]
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s gauge" % name)
        lines.append("%s%s %s" % (name, labels, repr(float(value)) if isinstance(value, float) else int(value)))
    return "\n".join(lines) + "\n"


def write_metrics(path, summary):
    """Replace path with the run's metrics: written beside it, then renamed (node_exporter never reads half)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as handle:
            handle.write(metrics_text(summary))
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except (IOError, OSError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _emit(summary, cfg, out):
    line = json.dumps(summary, sort_keys=True)
    out.write(line + "\n")
    out.flush()
    if cfg.get("summary_file"):
        with open(cfg["summary_file"], "a") as handle:
            handle.write(line + "\n")
    # A skipped run (another pruner holds the lock) measured nothing: that pruner writes the metrics.
    if cfg.get("metrics_file") and summary.get("watermark_met") is not None:
        write_metrics(cfg["metrics_file"], summary)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Prune a shared KV-cache volume, least recently used first.")
    parser.add_argument("--config", help="JSON file with the settings (command-line options override it)")
    parser.add_argument("--path")
    parser.add_argument("--max-bytes", type=int, dest="max_bytes")
    parser.add_argument("--min-free-percent", type=float, dest="min_free_percent")
    parser.add_argument("--grace-seconds", type=int, dest="grace_seconds")
    parser.add_argument("--unit", choices=["file", "directory"])
    parser.add_argument("--include", action="append")
    parser.add_argument("--exclude", action="append")
    parser.add_argument("--companion", action="append", dest="companions")
    parser.add_argument("--time-source", choices=["auto", "atime", "mtime"], dest="time_source")
    parser.add_argument("--max-seconds", type=int, dest="max_seconds")
    parser.add_argument("--summary-file", dest="summary_file")
    parser.add_argument("--metrics-file", dest="metrics_file")
    parser.add_argument("--dry-run", action="store_const", const=True, dest="dry_run")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = {}
    try:
        if args.config:
            with open(args.config) as handle:
                config.update(json.load(handle))
        for key, value in vars(args).items():
            if key != "config" and value is not None:
                config[key] = value
        status, _summary = prune(config)
    except (PruneError, ValueError, IOError, OSError) as exc:
        sys.stderr.write("kvcache_prune: %s\n" % exc)
        return EXIT_ERROR
    return status


if __name__ == "__main__":
    sys.exit(main())

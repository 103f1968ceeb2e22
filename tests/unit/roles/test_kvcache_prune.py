# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of the fs-tier pruner shipped in roles/kvcache_prune/files/kvcache_prune.py.

Real files in tmp dirs with controlled mtimes/atimes (os.utime); the volume size is
injected (statvfs stand-in) so free-space watermarks are exact.
"""

from __future__ import absolute_import, division, print_function

import importlib.util
import io
import json
import os
import time

import pytest
import yaml

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "roles", "kvcache_prune", "files", "kvcache_prune.py")

_spec = importlib.util.spec_from_file_location("kvcache_prune_script", SCRIPT)
kp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kp)

NOW = 1_800_000_000.0
HOUR = 3600
# LMCache 0.5.6 fs names: <model>@<world_size>@<worker_id>@<chunk_hash>@<dtype>.data
# (fs_connector, "/" in the model becomes "-SEP-"); MP-mode fs_l2_adapter names:
# <model>@0x<kv_rank>@<group>@<hash>.data. Temp files: the same name with .tmp.
NAME = "-SEP-models-SEP-tiny@1@0@%s@bfloat16.data"


def make(root, rel, size, age_mtime, age_atime=None, ctime_now=False):
    """A file of `size` bytes, modified `age_mtime` seconds and read `age_atime` seconds before NOW."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)
    atime = NOW - (age_mtime if age_atime is None else age_atime)
    os.utime(path, (atime, NOW - age_mtime))
    return path


def fake_mountinfo(tmp_path, root, options):
    info = tmp_path / "mountinfo"
    info.write_text("36 35 0:30 / %s %s shared:1 - ext4 /dev/sda1 rw\n" % (root, options))
    return str(info)


def run(root, tmp_path, now=NOW, volume=(10 ** 9, 9 * 10 ** 8), mount_opts="rw,noatime", **cfg):
    """prune() at NOW with an injected volume size and mount table.

    ctime cannot be set from user space: the files' real ctimes (the wall clock, before
    NOW) never make them young; a test that wants a just-written file sets its mtime
    inside the grace period instead.
    """
    out = io.StringIO()
    config = {"path": str(root), "grace_seconds": 600}
    config.update(cfg)
    status, summary = kp.prune(config, out=out, now=now, statvfs=lambda p: volume,
                               clock=lambda: 0.0, mountinfo=fake_mountinfo(tmp_path, str(root), mount_opts))
    return status, summary, out.getvalue()


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "kvcache"
    path.mkdir()
    return path


def names(out, verb="removed"):
    return [line.split()[1 if verb == "removed" else 2] for line in out.splitlines()
            if line.startswith(verb + " ")]


def test_lru_order_by_mtime_down_to_size_watermark(root, tmp_path):
    for i, age in enumerate([5, 1, 4, 2, 3]):  # hours since last write
        make(str(root), NAME % ("h%d" % i), 100, age * HOUR)
    status, summary, out = run(root, tmp_path, max_bytes=250, time_source="mtime")
    assert status == kp.EXIT_OK
    # 500 bytes, watermark 250: the three oldest (5h, 4h, 3h) go, oldest first.
    assert names(out) == [NAME % "h0", NAME % "h2", NAME % "h4"]
    assert sorted(os.listdir(str(root))) == sorted([NAME % "h1", NAME % "h3", kp.LOCK_NAME])
    assert summary["removed_entries"] == 3 and summary["removed_bytes"] == 300
    assert summary["remaining_bytes"] == 200 and summary["watermark_met"] is True
    assert json.loads(out.splitlines()[-1]) == summary


def test_atime_makes_a_recently_read_file_recent(root, tmp_path):
    make(str(root), NAME % "old_but_read", 100, 10 * HOUR, age_atime=2 * HOUR)
    make(str(root), NAME % "mid", 100, 5 * HOUR)
    make(str(root), NAME % "new", 100, 3 * HOUR)
    status, summary, out = run(root, tmp_path, max_bytes=200, mount_opts="rw,relatime")
    assert summary["time_source"] == "atime"
    assert names(out) == [NAME % "mid"]
    # Same files by mtime (noatime mount): the old one goes.
    status, summary, out = run(root, tmp_path, max_bytes=100, mount_opts="rw,noatime", dry_run=True)
    assert summary["time_source"] == "mtime"
    assert names(out, "would remove") == [NAME % "old_but_read"]


def test_grace_period_protects_young_files_even_if_watermark_is_missed(root, tmp_path):
    make(str(root), NAME % "old", 100, 2 * HOUR)
    make(str(root), NAME % "young1", 100, 60)
    make(str(root), NAME % "young2", 100, 599)
    status, summary, out = run(root, tmp_path, max_bytes=0 + 50, grace_seconds=600, time_source="mtime")
    assert names(out) == [NAME % "old"]
    assert summary["young_entries"] == 2
    assert summary["watermark_met"] is False and status == kp.EXIT_WATERMARK_NOT_MET
    assert os.path.exists(os.path.join(str(root), NAME % "young1"))


def test_recent_read_is_in_flight_when_atime_is_used(root, tmp_path):
    make(str(root), NAME % "being_read", 100, 2 * HOUR, age_atime=10)
    make(str(root), NAME % "idle", 100, 1 * HOUR)
    status, summary, out = run(root, tmp_path, max_bytes=1, time_source="atime")
    assert names(out) == [NAME % "idle"]
    assert summary["young_entries"] == 1


def test_temp_partial_and_hidden_files_are_never_touched(root, tmp_path):
    make(str(root), (NAME % "a")[:-5] + ".tmp", 1000, 5 * HOUR)   # LMCache temp (with_suffix)
    make(str(root), "tmpdir/" + NAME % "b", 1000, 5 * HOUR)       # relative_tmp_dir
    make(str(root), ".nfs000000000001", 1000, 5 * HOUR)          # NFS silly rename
    make(str(root), ".snapshot/x.data", 1000, 5 * HOUR)          # ONTAP snapshots
    make(str(root), "notes.txt", 1000, 5 * HOUR)                 # not cache data
    make(str(root), NAME % "c", 10, 5 * HOUR)
    status, summary, out = run(root, tmp_path, max_bytes=1, time_source="mtime",
                               exclude=kp.DEFAULTS["exclude"] + ["tmpdir"])
    assert names(out) == [NAME % "c"]
    # Excluded: the .tmp file, tmpdir, .nfs*, .snapshot and the pruner's own lock file.
    assert summary["excluded"] == 5 and summary["not_included"] == 1
    assert summary["scanned_bytes"] == 10
    for rel in ((NAME % "a")[:-5] + ".tmp", "tmpdir/" + NAME % "b", ".nfs000000000001", "notes.txt"):
        assert os.path.exists(os.path.join(str(root), rel))


def test_free_space_watermark(root, tmp_path):
    for i in range(5):
        make(str(root), NAME % ("f%d" % i), 100, (10 - i) * HOUR)
    # Volume 10000 bytes, 550 free; want 8% = 800 free -> 250 bytes must go -> 3 files.
    status, summary, out = run(root, tmp_path, volume=(10000, 550), min_free_percent=8, time_source="mtime")
    assert names(out) == [NAME % "f0", NAME % "f1", NAME % "f2"]
    assert summary["need_bytes"] == 250 and summary["removed_bytes"] == 300
    assert status == kp.EXIT_OK


def test_both_watermarks_take_the_larger_need(root, tmp_path):
    for i in range(4):
        make(str(root), NAME % ("b%d" % i), 100, (10 - i) * HOUR)
    # Size needs 400 - 150 = 250; free space (50% of 10000 = 5000, 9900 free) needs none.
    status, summary, out = run(root, tmp_path, volume=(10000, 9900), max_bytes=150,
                               min_free_percent=50, time_source="mtime")
    assert summary["need_bytes"] == 250 and len(names(out)) == 3
    # Size needs 400 - 350 = 50; free space (10% of 10000 = 1000, 800 free) needs 200.
    status, summary, out = run(root, tmp_path, volume=(10000, 800), max_bytes=350,
                               min_free_percent=10, time_source="mtime", dry_run=True)
    assert summary["need_bytes"] == 200 and len(names(out, "would remove")) == 1


def test_nothing_to_do_below_watermarks(root, tmp_path):
    make(str(root), NAME % "x", 100, 5 * HOUR)
    status, summary, out = run(root, tmp_path, max_bytes=1000, min_free_percent=5)
    assert status == kp.EXIT_OK and summary["removed_entries"] == 0 and summary["need_bytes"] == 0


def test_dry_run_removes_nothing_and_reports_the_same_plan(root, tmp_path):
    for i in range(4):
        make(str(root), NAME % ("d%d" % i), 100, (10 - i) * HOUR)
    before = sorted(os.listdir(str(root)))
    status, summary, out = run(root, tmp_path, max_bytes=150, dry_run=True, time_source="mtime")
    assert sorted(os.listdir(str(root))) == before  # not even a lock file
    assert names(out, "would remove") == [NAME % "d0", NAME % "d1", NAME % "d2"]
    assert summary["dry_run"] is True and summary["removed_bytes"] == 300
    status, real, out = run(root, tmp_path, max_bytes=150, time_source="mtime")
    assert names(out) == [NAME % "d0", NAME % "d1", NAME % "d2"]


def test_directory_unit_removes_whole_entries_and_skips_incomplete_ones(root, tmp_path):
    # vLLM ExampleConnector: one directory per prompt, one file per layer.
    for d, age in (("p-old", 5), ("p-mid", 3), ("p-new", 1)):
        for layer in range(2):
            make(str(root), "%s/model.layers.%d.self_attn.attn.safetensors" % (d, layer), 50, age * HOUR)
    make(str(root), "p-writing/model.layers.0.self_attn.attn.safetensors", 50, 9 * HOUR)
    make(str(root), "p-writing/model.layers.1.self_attn.attn.safetensors.tmp", 50, 9 * HOUR)
    status, summary, out = run(root, tmp_path, unit="directory", include=["*"], max_bytes=150, time_source="mtime")
    assert names(out) == ["p-old", "p-mid"]
    assert sorted(os.listdir(str(root))) == sorted(["p-new", "p-writing", kp.LOCK_NAME])
    assert summary["incomplete_dirs"] == 1


def test_listing_a_directory_entry_is_not_a_use(root, tmp_path):
    # With atime as the clock, a directory's own atime moves whenever anything lists it
    # (du, ls, the pruner's walk); only reads of its files make the entry recent.
    for d, age in (("p-old", 5), ("p-mid", 3), ("p-new", 1)):
        make(str(root), "%s/layer.safetensors" % d, 50, age * HOUR)
        os.utime(os.path.join(str(root), d), (NOW - 60, NOW - age * HOUR))  # listed a minute ago
    make(str(root), "p-read/layer.safetensors", 50, 9 * HOUR, age_atime=2 * HOUR)  # its file was read
    os.utime(os.path.join(str(root), "p-read"), (NOW - 60, NOW - 9 * HOUR))
    status, summary, out = run(root, tmp_path, unit="directory", include=["*"], max_bytes=100,
                               mount_opts="rw,relatime")
    assert summary["time_source"] == "atime"
    assert names(out) == ["p-old", "p-mid"]
    assert sorted(os.listdir(str(root))) == sorted(["p-new", "p-read", kp.LOCK_NAME])


def test_a_held_lock_skips_the_run(root, tmp_path):
    import fcntl
    make(str(root), NAME % "x", 100, 5 * HOUR)
    with open(os.path.join(str(root), kp.LOCK_NAME), "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        status, summary, out = run(root, tmp_path, max_bytes=1, time_source="mtime")
    assert status == kp.EXIT_OK and summary["removed_entries"] == 0 and "skipped" in summary
    assert os.path.exists(os.path.join(str(root), NAME % "x"))


def test_time_budget_stops_cleanly(root, tmp_path):
    for i in range(3):
        make(str(root), NAME % ("t%d" % i), 100, (10 - i) * HOUR)
    ticks = iter([0.0, 0.0, 5.0, 11.0, 12.0, 13.0, 14.0])
    out = io.StringIO()
    status, summary = kp.prune({"path": str(root), "max_bytes": 1, "max_seconds": 10, "time_source": "mtime"},
                               out=out, now=NOW, statvfs=lambda p: (10 ** 6, 10 ** 5), clock=lambda: next(ticks))
    assert summary["timed_out"] is True and summary["removed_entries"] == 2
    assert status == kp.EXIT_WATERMARK_NOT_MET


def test_summary_file_gets_one_json_line_per_run(root, tmp_path):
    make(str(root), NAME % "s", 100, 5 * HOUR)
    log = tmp_path / "summary.jsonl"
    run(root, tmp_path, max_bytes=1, summary_file=str(log), time_source="mtime")
    run(root, tmp_path, max_bytes=1, summary_file=str(log), time_source="mtime")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["removed_entries"] for x in lines] == [1, 0]


@pytest.mark.parametrize("cfg, message", [
    ({}, "no watermark"),
    ({"max_bytes": -1}, "max_bytes"),
    ({"min_free_percent": 100}, "min_free_percent"),
    ({"max_bytes": 1, "unit": "block"}, "unit"),
    ({"max_bytes": 1, "time_source": "ctime"}, "time_source"),
])
def test_bad_configuration_is_refused(root, tmp_path, cfg, message):
    with pytest.raises(kp.PruneError, match=message):
        run(root, tmp_path, **cfg)


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(kp.PruneError, match="not a directory"):
        kp.prune({"path": str(tmp_path / "absent"), "max_bytes": 1})


def test_main_reads_a_config_file_and_cli_overrides(root, tmp_path, capsys):
    path = make(str(root), NAME % "m", 100, 0)
    # main() uses the real clock, and the real ctime is "just now": no grace period here.
    os.utime(path, (time.time() - 5 * 24 * HOUR, time.time() - 5 * 24 * HOUR))
    conf = tmp_path / "prune.json"
    conf.write_text(json.dumps({"path": str(root), "max_bytes": 1, "time_source": "mtime", "grace_seconds": 0}))
    assert kp.main(["--config", str(conf), "--dry-run"]) == kp.EXIT_OK
    assert os.path.exists(os.path.join(str(root), NAME % "m"))
    assert kp.main(["--config", str(conf)]) == kp.EXIT_OK
    assert not os.path.exists(os.path.join(str(root), NAME % "m"))
    assert kp.main(["--path", str(tmp_path / "nope"), "--max-bytes", "1"]) == kp.EXIT_ERROR
    assert "not a directory" in capsys.readouterr().err


def test_mount_options_pick_the_longest_mount_point(tmp_path):
    info = tmp_path / "mi"
    info.write_text(
        "1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "2 1 0:50 / /mnt/kvcache rw,noatime shared:2 - nfs4 srv:/vol rw,vers=4.1\n")
    point, opts = kp.mount_options("/mnt/kvcache/sub", str(info))
    assert point == "/mnt/kvcache" and "noatime" in opts and "vers=4.1" in opts
    assert kp.resolve_time_source("auto", "/mnt/kvcache", str(info)) == "mtime"
    assert kp.resolve_time_source("auto", "/srv", str(info)) == "atime"


# LMCache 0.5.6's GdsBackend (lmcache/v1/storage_backend/gds_backend.py, _key_to_path, save_metadata):
# <gds_path>/<hash[:2]>/<hash[2:4]>/<quoted key>.kvcache.safetensors and its index
# <...>.kvcache.safetensors.metadata, each written as <file>.tmp<8 hex> and renamed.
GDS_NAME = "vllm%%40-models-tiny%%401%%400%%40%s%%40bfloat16.kvcache.safetensors"


def gds(root, chunk_hash, size, age, metadata=True):
    rel = "gds/%s/%s/%s" % (chunk_hash[:2], chunk_hash[2:4], GDS_NAME % chunk_hash)
    make(str(root), rel, size, age)
    if metadata:
        make(str(root), rel + ".metadata", 4096, age)
    return rel


def role_defaults():
    with open(os.path.join(ROOT, "roles", "kvcache_prune", "defaults", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("settings", ["pruner", "role"])
def test_the_gds_tier_is_pruned_entry_by_entry(root, tmp_path, settings):
    """Issue #34 defect 5: the GDS backend's files are cache entries; an entry's data and its
    .metadata index are sized, dated and removed together (index first); temp files and young
    entries stay. With the pruner's own defaults and with the role's (prune.json).

    Failed on the old pruner: it matched *.data only and removed nothing of the GDS tier."""
    old = gds(root, "1111aaaa", 100000, 9 * HOUR)
    mid = gds(root, "2222bbbb", 100000, 7 * HOUR)
    new = gds(root, "3333cccc", 100000, 5 * HOUR)
    young = gds(root, "4444dddd", 100000, 60)
    tmp = make(str(root), "gds/55/55/%s.tmp0a1b2c3d" % (GDS_NAME % "5555eeee"), 100000, 9 * HOUR)
    fs_entry = make(str(root), NAME % "fsold", 50000, 8 * HOUR)  # the fs connector's, before GDS was on
    cfg = {}
    if settings == "role":
        defaults = role_defaults()
        cfg = {"include": defaults["kvcache_prune_include"], "exclude": defaults["kvcache_prune_exclude"],
               "companions": defaults["kvcache_prune_companions"]}
    # 4 GDS entries of 104096 bytes and one fs entry of 50000: keep at most 2 entries' worth.
    status, summary, out = run(root, tmp_path, max_bytes=2 * 104096, time_source="mtime", **cfg)
    assert summary["scanned_entries"] == 5 and summary["scanned_bytes"] == 4 * 104096 + 50000
    assert names(out) == [old, NAME % "fsold", mid]
    for rel in (old, old + ".metadata", mid, mid + ".metadata", NAME % "fsold"):
        assert not os.path.exists(os.path.join(str(root), rel)), rel
    for rel in (new, new + ".metadata", young, young + ".metadata"):
        assert os.path.exists(os.path.join(str(root), rel)), rel
    assert os.path.exists(tmp) and not os.path.exists(fs_entry)
    assert summary["removed_bytes"] == 2 * 104096 + 50000 and status == kp.EXIT_OK


def test_a_gds_index_goes_before_its_data_and_an_orphan_index_is_an_entry(root, tmp_path, monkeypatch):
    entry = gds(root, "6666ffff", 1000, 9 * HOUR)
    orphan = gds(root, "7777aaaa", 1000, 8 * HOUR)
    os.unlink(os.path.join(str(root), orphan))  # a run stopped between the two removals
    order = []
    real_unlink = os.unlink

    def unlink(path):
        order.append(os.path.relpath(path, str(root)))
        real_unlink(path)

    monkeypatch.setattr(kp.os, "unlink", unlink)
    status, summary, out = run(root, tmp_path, max_bytes=1, time_source="mtime")
    assert order == [entry + ".metadata", entry, orphan + ".metadata"]
    assert names(out) == [entry, orphan + ".metadata"] and status == kp.EXIT_OK


def test_the_role_prunes_the_gds_directory_it_configures():
    """The GDS directory LMCache writes (kvcache_fs_gds_path) is under the pruned path by default."""
    with open(os.path.join(ROOT, "roles", "kvcache", "defaults", "main.yml"), encoding="utf-8") as handle:
        fleet = yaml.safe_load(handle)
    assert fleet["kvcache_fs_gds_path"].startswith("{{ kvcache_fs_path }}/")
    assert role_defaults()["kvcache_prune_path"].startswith("{{ kvcache_fs_path")
    template = open(os.path.join(ROOT, "roles", "kvcache_prune", "templates", "prune.json.j2"), encoding="utf-8").read()
    assert '"companions": kvcache_prune_companions' in template


def _samples(text):
    """The metrics file parsed by prometheus-client's own parser: {name: (labels, value)}."""
    from prometheus_client.parser import text_string_to_metric_families
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge" and family.documentation, family.name
        for sample in family.samples:
            found[sample.name] = (sample.labels, sample.value)
    return found


def test_a_run_writes_the_tiers_fill_and_its_results_as_metrics(root, tmp_path):
    """Issue #37 item 3: node_exporter's textfile collector reads what the alert rules need."""
    for i in range(4):
        make(str(root), NAME % ("m%d" % i), 100, (10 - i) * HOUR)
    metrics = tmp_path / "kvcache_prune.prom"
    status, summary, _out = run(root, tmp_path, max_bytes=250, min_free_percent=5, metrics_file=str(metrics),
                                time_source="mtime", volume=(10 ** 6, 4 * 10 ** 5))
    assert status == kp.EXIT_OK and summary["removed_entries"] == 2
    got = _samples(metrics.read_text())
    assert set(got) == {name for name, _help, _source in kp.METRICS}
    assert {labels["path"] for labels, _value in got.values()} == {str(root)}
    values = {name: value for name, (_labels, value) in got.items()}
    assert values["kvcache_tier_bytes"] == 200 and values["kvcache_tier_entries"] == 2
    assert values["kvcache_prune_removed_bytes"] == 200 and values["kvcache_prune_removed_entries"] == 2
    assert values["kvcache_prune_watermark_met"] == 1 and values["kvcache_prune_errors"] == 0
    assert values["kvcache_tier_max_bytes"] == 250 and values["kvcache_tier_min_free_ratio"] == 0.05
    assert values["kvcache_tier_volume_size_bytes"] == 10 ** 6 and values["kvcache_tier_volume_avail_bytes"] == 4 * 10 ** 5
    assert values["kvcache_prune_last_run_timestamp_seconds"] == 0.0  # the injected clock
    assert values["kvcache_prune_dry_run"] == 0
    assert oct(os.stat(str(metrics)).st_mode & 0o777) == "0o644"
    assert [p for p in os.listdir(str(tmp_path)) if p.endswith(".tmp")] == []


def test_an_undersized_tier_says_so_in_its_metrics(root, tmp_path):
    make(str(root), NAME % "young", 500, 0)  # inside the grace period: cannot go
    metrics = tmp_path / "kvcache_prune.prom"
    status, _summary, _out = run(root, tmp_path, max_bytes=100, metrics_file=str(metrics), time_source="mtime")
    values = {name: value for name, (_labels, value) in _samples(metrics.read_text()).items()}
    assert status == kp.EXIT_WATERMARK_NOT_MET
    assert values["kvcache_prune_watermark_met"] == 0 and values["kvcache_tier_bytes"] == 500


def test_a_skipped_run_leaves_the_metrics_to_the_pruner_that_ran(root, tmp_path):
    import fcntl
    metrics = tmp_path / "kvcache_prune.prom"
    metrics.write_text("# the running pruner's\n")
    with open(os.path.join(str(root), kp.LOCK_NAME), "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        run(root, tmp_path, max_bytes=1, metrics_file=str(metrics), time_source="mtime")
    assert metrics.read_text() == "# the running pruner's\n"


def test_a_path_label_is_escaped():
    keys = ("finished_at", "errors", "removed_entries", "removed_bytes", "duration_seconds", "remaining_bytes",
            "scanned_entries", "max_bytes", "min_free_percent", "volume_bytes", "volume_avail_bytes_after")
    summary = dict({key: 0 for key in keys}, path='/mnt/a "b"\\c', watermark_met=True, dry_run=False)
    text = kp.metrics_text(summary)
    assert {labels["path"] for labels, _value in _samples(text).values()} == {'/mnt/a "b"\\c'}

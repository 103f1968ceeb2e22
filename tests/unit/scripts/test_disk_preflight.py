"""Unit tests for scripts/disk-preflight.py (make test's first step) and SeaweedFS's writable-bucket
wait (scripts/bench_storage.py), both written after CI failed 15 minutes in on a full disk."""
import collections
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = importlib.util.spec_from_file_location("kvcache_offload_disk_preflight",
                                              os.path.join(ROOT, "scripts", "disk-preflight.py"))
preflight = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(preflight)

Usage = collections.namedtuple("Usage", "total used free")


def _free(monkeypatch, gb):
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _path: Usage(0, 0, gb * 1e9))


def _warm(build):
    python = build / "gpu-contract" / "pins-0.32.0-0.5.6" / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")


def test_a_cold_run_on_a_disk_with_too_little_room_is_refused_before_anything_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVCACHE_BUILD_DIR", str(tmp_path))
    _free(monkeypatch, 24)  # what the disk had when CI failed in the deleted-object test
    assert preflight.main() == 1
    err = capsys.readouterr().err
    assert "24.0 GB free" in err and "a cold run needs 32 GB" in err and "KVCACHE_TEST_MIN_FREE_GB" in err


def test_a_cold_run_with_room_goes_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVCACHE_BUILD_DIR", str(tmp_path))
    _free(monkeypatch, 40)
    assert preflight.main() == 0
    assert "cold run needs 32 GB" in capsys.readouterr().out


def test_a_warm_build_dir_needs_less(monkeypatch, tmp_path):
    monkeypatch.setenv("KVCACHE_BUILD_DIR", str(tmp_path))
    _warm(tmp_path)
    _free(monkeypatch, 10)
    assert preflight.main() == 0
    _free(monkeypatch, 5)
    assert preflight.main() == 1


def test_the_threshold_can_be_lowered_by_who_knows_the_run_fits(monkeypatch, tmp_path):
    monkeypatch.setenv("KVCACHE_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(preflight, "COLD_GB", 20.0)
    _free(monkeypatch, 24)
    assert preflight.main() == 0


class _Client:
    """boto3's S3 client as a SeaweedFS without writable volumes answers it: every put fails."""

    def __init__(self, fail_puts):
        self.fail_puts = fail_puts
        self.calls = []

    def create_bucket(self, Bucket):  # noqa: N803 (boto3's argument names)
        self.calls.append(("create", Bucket))

    def put_object(self, Bucket, Key, Body):  # noqa: N803
        self.calls.append(("put", Key))
        if self.fail_puts:
            self.fail_puts -= 1
            raise OSError("InternalError: no writable volumes")

    def get_object(self, Bucket, Key):  # noqa: N803
        self.calls.append(("get", Key))
        return {"Body": type("Body", (), {"read": lambda self: b"ready"})()}

    def delete_object(self, Bucket, Key):  # noqa: N803
        self.calls.append(("delete", Key))


def _store(tmp_path, client, monkeypatch):
    import bench_storage  # scripts/ is on sys.path (conftest.py)

    monkeypatch.setattr(bench_storage.time, "sleep", lambda _seconds: None)
    store = bench_storage.SeaweedFS("weed", str(tmp_path), start_timeout=0.05)
    store.s3_port = 1
    (tmp_path / "weed.log").write_text("volume server: disk usage above minFreeSpace, read-only\n")
    monkeypatch.setattr(store, "client", lambda: client)
    return store


def test_the_bucket_is_ready_once_an_object_was_written_read_and_deleted(tmp_path, monkeypatch):
    client = _Client(fail_puts=2)
    store = _store(tmp_path, client, monkeypatch)
    store.start_timeout = 30
    assert store.create_writable_bucket("kv") is client
    assert client.calls[0] == ("create", "kv")
    assert client.calls[-2:] == [("get", "kvcache-offload-ready"), ("delete", "kvcache-offload-ready")]


def test_a_bucket_that_takes_no_write_fails_with_the_disk_and_the_log(tmp_path, monkeypatch):
    store = _store(tmp_path, _Client(fail_puts=10 ** 9), monkeypatch)
    with pytest.raises(RuntimeError) as err:
        store.create_writable_bucket("kv")
    text = str(err.value)
    assert "took no write into bucket kv" in text and "no writable volumes" in text
    assert "GB" in text and "read-only" in text

"""The chunk-size sweep of the storage bench (issue #21 item 4): objects per size, rows, table."""
import bench_storage


def _result(objects, nbytes, seconds):
    run = {"streams": 8, "connector": "S3Connector", "bit_exact": True}
    for op in ("put", "get"):
        run[op] = bench_storage.throughput(objects, nbytes, seconds, [seconds / objects] * objects)
    return {"ok": True, "runs": [run]}


def test_same_bytes_for_every_chunk_size():
    assert [bench_storage.sweep_objects(32, 256, c) for c in bench_storage.SWEEP_CHUNKS] == [32, 16, 8, 4]
    assert bench_storage.sweep_objects(3, 256, 2048) == 2
    # one object per stream at least: 8 streams on 4 large objects would measure parallelism
    assert [bench_storage.sweep_objects(32, 256, c, 8) for c in bench_storage.SWEEP_CHUNKS] == [32, 16, 8, 8]


def test_rows_carry_throughput_and_ops_per_chunk_size():
    rows = bench_storage.sweep_rows("s3", 1024, 4 * 10 ** 6, _result(8, 32 * 10 ** 6, 2.0))
    assert [(r["op"], r["chunk_size"], r["mb_per_s"], r["ops_per_s"]) for r in rows] == [
        ("put", 1024, 16.0, 4.0), ("get", 1024, 16.0, 4.0)]
    failed = bench_storage.sweep_rows("fs", 2048, 8 * 10 ** 6, {"ok": False, "error": "worker died"})
    assert failed[0]["error"] == "worker died" and failed[0]["mb_per_s"] is None


def test_sweep_table_in_bench_md():
    rows = bench_storage.sweep_rows("fs", 256, 10 ** 6, _result(4, 4 * 10 ** 6, 1.0))
    rows += bench_storage.sweep_rows("s3", 2048, 8 * 10 ** 6, {"error": "timeout"})
    text = "\n".join(bench_storage.render_sweep(rows))
    assert "| fs | 256 | 1.0 | 8 | PUT | 4.0 | 4.0 | 250.0 | True |" in text
    assert "| s3 | 2048 | 8.0 | - | - | - | - | - | ERROR: timeout |" in text
    assert bench_storage.render_sweep([]) == []


def test_a_row_whose_objects_were_not_the_chunk_size_gets_no_number():
    """The 2026-12-02 sweeps measured 256-token objects at every chunk size (LMCacheMetadata's own
    chunk_size defaulted to 256): a result whose objects are not the row's size is an error row."""
    result = _result(8, 8 * 131072, 1.0)
    result["runs"][0]["object_bytes"] = 131072
    rows = bench_storage.sweep_rows("s3", 2048, 2048 * 512, result)
    assert len(rows) == 1 and rows[0]["mb_per_s"] is None, rows
    assert "131072-byte objects, not 1048576" in rows[0]["error"], rows
    result["runs"][0]["object_bytes"] = 2048 * 512
    assert [r["op"] for r in bench_storage.sweep_rows("s3", 2048, 2048 * 512, result)] == ["put", "get"]

"""Unit tests for scripts/bench.py helpers (no network, no subprocess services)."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = importlib.util.spec_from_file_location("kvcache_offload_bench", os.path.join(ROOT, "scripts", "bench.py"))
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

RECAP = """
PLAY [nodes] *******************************************************************

TASK [Gathering Facts] *********************************************************
ok: [node1]

PLAY RECAP *********************************************************************
node1                      : ok=42   changed=0    unreachable=0    failed=0    skipped=7    rescued=0    ignored=0
node2                      : ok=40   changed=2    unreachable=0    failed=1    skipped=7    rescued=0    ignored=0
router                     : ok=12   changed=0    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0

Sunday 29 November 2026  23:00:00 +0000 (0:00:01.000)       0:00:42.000 ******
"""


def test_parse_play_recap():
    got = bench.parse_play_recap(RECAP)
    assert set(got) == {"node1", "node2", "router"}
    assert got["node2"] == {"ok": 40, "changed": 2, "unreachable": 0, "failed": 1, "skipped": 7, "rescued": 0, "ignored": 0}
    assert bench.parse_play_recap("no recap here") == {}


def test_parse_play_recap_uses_the_last_recap():
    text = RECAP + "\nPLAY RECAP ***\nnode1 : ok=1 changed=5 unreachable=0 failed=0\n"
    assert bench.parse_play_recap(text) == {"node1": {"ok": 1, "changed": 5, "unreachable": 0, "failed": 0}}


def test_time_command_reads_recap_and_times(tmp_path):
    script = tmp_path / "fake-playbook.py"
    script.write_text("import sys\nsys.stdout.write(%r)\nsys.exit(2)\n" % RECAP)
    got = bench.time_command([sys.executable, str(script)], label="noop", timeout=60)
    assert got["label"] == "noop"
    assert got["rc"] == 2
    assert got["hosts"] == 3
    assert got["changed_total"] == 2
    assert got["failed_total"] == 1
    assert got["seconds"] > 0
    assert got["per_host_seconds"] == pytest.approx(got["seconds"] / 3)
    assert got["timed_out"] is False


def test_time_command_timeout_and_missing_binary(tmp_path):
    got = bench.time_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5)
    assert got["timed_out"] is True and got["rc"] is None
    got = bench.time_command([str(tmp_path / "nope")])
    assert got["rc"] is None and got["hosts"] == 0 and got["changed_total"] is None


def test_throughput_and_percentile():
    got = bench.throughput(4, 4 * 32 * 1024 * 1024, 2.0, [0.1, 0.2, 0.3, 0.4])
    assert got["mb_per_s"] == pytest.approx(4 * 33.554432 / 2)
    assert got["ops_per_s"] == 2.0
    assert got["latency_p50_ms"] in (200.0, 300.0)
    assert bench.throughput(0, 0, 1.0, [])["mb_per_s"] is None
    assert bench.percentile([], 50) is None


def test_storage_ratios():
    tiers = {"s3": {"plain_client": "boto3",
                    "plain": {"runs": [{"streams": 1, "put": {"mb_per_s": 100.0}, "get": {"mb_per_s": 400.0}}]},
                    "lmcache": {"runs": [{"streams": 1, "put": {"mb_per_s": 50.0}, "get": {"mb_per_s": 600.0}}]}},
             "fs": {"plain_client": "file", "plain": {"runs": [{"streams": 8, "put": {"mb_per_s": 10.0},
                                                                "get": {"mb_per_s": 20.0}}]}}}
    got = {(r["tier"], r["op"], r["streams"]): r for r in bench.storage_ratios(tiers)}
    assert got[("s3", "put", 1)]["lmcache_over_plain"] == 0.5
    assert got[("s3", "get", 1)]["lmcache_over_plain"] == 1.5
    assert got[("fs", "get", 8)]["lmcache_over_plain"] is None  # LMCache not measured


def test_measured_tiers_prefers_lmcache_at_most_streams():
    storage = {"tiers": {"s3": {"plain_client": "boto3", "lmcache": {"runs": [
        {"streams": 1, "get": {"mb_per_s": 100.0, "bytes": 800, "objects": 8}},
        {"streams": 8, "get": {"mb_per_s": 300.0, "bytes": 800, "objects": 8}}]},
        "plain": {"runs": [{"streams": 8, "get": {"mb_per_s": 999.0, "bytes": 800, "objects": 8}}]}}}}
    tiers = bench.measured_tiers(storage)
    assert [t["name"] for t in tiers] == ["s3/lmcache"]
    assert tiers[0]["bytes_per_s"] == 300e6


def test_predict_rows_use_the_filter():
    reference = bench.load_reference()
    rows = bench.predict(reference, [{"name": "slow", "bytes_per_s": 1e9}], [4096])
    assert len(rows) == len(reference["prefill_rates"])
    row = [r for r in rows if r["model"] == "Llama-3.1-8B" and r["gpu"] == "H100"][0]
    # 131072 B/token x 4096 tokens = 512 MiB; at 1 GB/s 0.537 s; recompute 4096 / 32908 = 0.124 s
    assert row["kv_bytes"] == 131072 * 4096
    assert row["prefill_tokens_per_s"] == pytest.approx(32908, abs=1)
    assert row["tiers"]["slow"]["load_seconds"] == pytest.approx(0.536870912)
    assert row["tiers"]["slow"]["load_wins"] is False
    # PCIe Gen5 nominal 64 GB/s: 8.4 ms, loading wins ~14.8x
    assert row["tiers"]["cpu_ram_pcie_nominal"]["load_wins"] is True
    assert row["break_even_bandwidth"] == pytest.approx(131072 * 32908, rel=1e-4)


def test_render_markdown_handles_partial_reports():
    report = {"meta": {"started": "t", "host": "h", "cpus": 2, "loadavg": "1.0", "mode": "smoke", "seconds": 1.0},
              "lab": {"skipped": True, "reason": "lab containers not running"},
              "converge": [{"label": "noop", "rc": 0, "seconds": 10.0, "hosts": 2, "per_host_seconds": 5.0,
                            "changed_total": 0, "failed_total": 0}]}
    text = bench.render_markdown(report)
    assert "Skipped: lab containers not running." in text
    assert "| noop | 0 | 10.0 | 2 | 5.0 | 0 | 0 |" in text


def test_make_words_is_deterministic():
    assert bench.make_words("a", 10) == bench.make_words("a", 10)
    assert bench.make_words("a", 10) != bench.make_words("b", 10)
    assert len(bench.make_words("a", 10).split()) == 10


def test_smoke_defaults_are_small():
    args = bench.parse_args(["--smoke"])
    assert args.model == "tiny-qwen2" and args.objects <= 16 and args.rounds >= 2
    args = bench.parse_args([])
    assert args.model == "Llama-3.1-8B" and args.rounds >= 5 and args.sizes == [512, 1024, 2048, 4096]
    with pytest.raises(SystemExit):
        bench.parse_args(["--streams", "1,100"])


def test_time_command_log_path(tmp_path):
    script = tmp_path / "fake-playbook.py"
    script.write_text("import sys\nsys.stdout.write(%r)\n" % RECAP)
    log = tmp_path / "run.log"
    got = bench.time_command([sys.executable, str(script)], label="logged", timeout=60, log_path=str(log))
    assert log.read_text() == RECAP
    assert got["rc"] == 0 and got["hosts"] == 3 and got["changed_total"] == 2


def test_converge_section_only_in_the_full_run():
    assert "converge" in bench.parse_args([]).sections
    assert bench.parse_args([]).converge_nodes == [2, 8, 32]
    assert "converge" not in bench.parse_args(["--smoke"]).sections
    assert bench.parse_args(["--sections", "converge", "--converge-nodes", "8,2"]).converge_nodes == [2, 8]
    with pytest.raises(SystemExit):
        bench.parse_args(["--converge-nodes", "0"])

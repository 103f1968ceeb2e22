"""Unit tests for scripts/bench.py: the command line and the frame of the report."""
import pytest

import bench


def test_render_markdown_handles_partial_reports():
    report = {"meta": {"started": "t", "host": "h", "cpus": 2, "loadavg": "1.0", "mode": "smoke", "seconds": 1.0},
              "lab": {"skipped": True, "reason": "lab containers not running"},
              "converge": [{"label": "noop", "rc": 0, "seconds": 10.0, "hosts": 2, "per_host_seconds": 5.0,
                            "changed_total": 0, "failed_total": 0}]}
    text = bench.render_markdown(report)
    assert "Skipped: lab containers not running." in text
    assert "| noop | 0 | 10.0 | 2 | 5.0 | 0 | 0 |" in text


def test_smoke_defaults_are_small():
    args = bench.parse_args(["--smoke"])
    assert args.model == "tiny-qwen2" and args.objects <= 16 and args.rounds >= 2
    args = bench.parse_args([])
    assert args.model == "Llama-3.1-8B" and args.rounds >= 5 and args.sizes == [512, 1024, 2048, 4096, 8192]
    assert args.lab_tiers == ["fs", "s3"] and bench.parse_args(["--smoke"]).lab_tiers == ["fs"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--lab-tiers", "fs,nfs"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--streams", "1,100"])


def test_converge_section_only_in_the_full_run():
    assert "converge" in bench.parse_args([]).sections
    assert bench.parse_args([]).converge_nodes == [2, 8, 32]
    assert "converge" not in bench.parse_args(["--smoke"]).sections
    assert bench.parse_args(["--sections", "converge", "--converge-nodes", "8,2"]).converge_nodes == [2, 8]
    with pytest.raises(SystemExit):
        bench.parse_args(["--converge-nodes", "0"])

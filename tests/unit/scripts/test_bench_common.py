"""Unit tests for scripts/bench_common.py: time_command() and the PLAY RECAP it reads."""
import sys

import pytest

import bench_common

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
    got = bench_common.parse_play_recap(RECAP)
    assert set(got) == {"node1", "node2", "router"}
    assert got["node2"] == {"ok": 40, "changed": 2, "unreachable": 0, "failed": 1, "skipped": 7, "rescued": 0, "ignored": 0}
    assert bench_common.parse_play_recap("no recap here") == {}


def test_parse_play_recap_uses_the_last_recap():
    text = RECAP + "\nPLAY RECAP ***\nnode1 : ok=1 changed=5 unreachable=0 failed=0\n"
    assert bench_common.parse_play_recap(text) == {"node1": {"ok": 1, "changed": 5, "unreachable": 0, "failed": 0}}


def test_time_command_reads_recap_and_times(tmp_path):
    script = tmp_path / "fake-playbook.py"
    script.write_text("import sys\nsys.stdout.write(%r)\nsys.exit(2)\n" % RECAP)
    got = bench_common.time_command([sys.executable, str(script)], label="noop", timeout=60)
    assert got["label"] == "noop"
    assert got["rc"] == 2
    assert got["hosts"] == 3
    assert got["changed_total"] == 2
    assert got["failed_total"] == 1
    assert got["seconds"] > 0
    assert got["per_host_seconds"] == pytest.approx(got["seconds"] / 3)
    assert got["timed_out"] is False


def test_time_command_timeout_and_missing_binary(tmp_path):
    got = bench_common.time_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5)
    assert got["timed_out"] is True and got["rc"] is None
    got = bench_common.time_command([str(tmp_path / "nope")])
    assert got["rc"] is None and got["hosts"] == 0 and got["changed_total"] is None


def test_time_command_log_path(tmp_path):
    script = tmp_path / "fake-playbook.py"
    script.write_text("import sys\nsys.stdout.write(%r)\n" % RECAP)
    log = tmp_path / "run.log"
    got = bench_common.time_command([sys.executable, str(script)], label="logged", timeout=60, log_path=str(log))
    assert log.read_text() == RECAP
    assert got["rc"] == 0 and got["hosts"] == 3 and got["changed_total"] == 2

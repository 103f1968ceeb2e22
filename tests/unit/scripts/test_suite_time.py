# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""scripts/suite-time.py: the suite table .ci/run ends with (issue #39 item 1)."""

from __future__ import absolute_import, division, print_function

import os
import subprocess
import sys

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "suite-time.py")

JUNIT = """<testsuites><testsuite>
<testcase classname="tests.integration.lab.test_faults" name="a" file="tests/integration/lab/test_faults.py" time="12.5"/>
<testcase classname="tests.integration.lab.test_faults" name="b" file="tests/integration/lab/test_faults.py" time="3">
<failure message="AssertionError: 1 ok, 2 failed
  assert 1 &gt;= 10">Traceback
E   AssertionError</failure></testcase>
<testcase classname="tests.integration.lab.test_router" name="c" file="tests/integration/lab/test_router.py" time="4.2"/>
</testsuite></testsuites>"""


def _run(tmp_path, *args):
    env = dict(os.environ, KVCACHE_BUILD_DIR=str(tmp_path))
    return subprocess.run([sys.executable, SCRIPT] + list(args), env=env, capture_output=True, text=True, check=False)


def test_a_suite_keeps_its_exit_code_and_its_row_says_so(tmp_path):
    assert _run(tmp_path, "run", "check", "--", "true").returncode == 0
    assert _run(tmp_path, "run", "lab first run", "--", "sh", "-c", "exit 3").returncode == 3
    rows = (tmp_path / "suite-times.tsv").read_text().splitlines()
    assert [r.split("\t")[0] for r in rows] == ["check", "lab first run"]
    assert rows[0].endswith("\tpassed") and rows[1].endswith("\tFAILED (exit 3)")


def test_junit_rows_are_per_test_file_with_setup_and_failures(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    assert _run(tmp_path, "junit", "lab test", str(tmp_path / "j.xml")).returncode == 0
    rows = dict((r.split("\t")[0], r.split("\t")[1:]) for r in (tmp_path / "suite-times.tsv").read_text().splitlines())
    assert rows == {"lab test test_faults.py": ["16", "FAILED"], "lab test test_router.py": ["4", "passed"]}


def test_the_table_ends_with_the_total_and_a_closing_count(tmp_path):
    _run(tmp_path, "run", "check", "--", "true")
    _run(tmp_path, "run", "fleet", "--", "false")
    out = _run(tmp_path, "table", "--total", "3000").stdout.splitlines()
    total = [line for line in out if line.startswith("total (.ci/run wall time)")]
    assert len(total) == 1 and "3000" in total[0] and "50.0 min" in total[0]
    assert out[-1] == "suites: 1 passed, 1 failed"
    # two suites to a line: the table fits the part of a CI log that is kept
    assert any(line.startswith("check") and "passed" in line and "fleet" in line and line.endswith("FAILED")
               for line in out)


def test_the_last_lines_say_why_each_failed_suite_failed(tmp_path):
    """CI keeps the last ~34 lines of a run: stop 43's test_faults failure was listed there as
    FAILED, and its assertion was cut (2026-12-07)."""
    (tmp_path / "j.xml").write_text(JUNIT)
    _run(tmp_path, "run", "check", "--", "sh", "-c", "echo 'ERROR: Found 1 pep8 issue(s)'; echo more; exit 2")
    _run(tmp_path, "junit", "lab test", str(tmp_path / "j.xml"))
    _run(tmp_path, "run", "fleet", "--", "sh", "-c", "echo a; echo the last words; exit 1")
    out = _run(tmp_path, "table", "--total", "60").stdout.splitlines()
    why = out[out.index("==> why (the first of each failed suite's errors; all of them: build/suite-logs/)") + 1:]
    assert why == [
        "check (FAILED (exit 2)): ERROR: Found 1 pep8 issue(s)",
        "lab test test_faults.py::b: AssertionError: 1 ok, 2 failed assert 1 >= 10",
        "fleet (FAILED (exit 1)): the last words",
        "suites: 1 passed, 3 failed",
    ]


def test_a_failed_suite_s_last_lines_are_repeated_before_the_table(tmp_path):
    """CI shows a run's end: the 2026-12-07 run's gpu-contract-venv failed in its first minute and
    said why only there, an hour of output above the table."""
    script = "for i in $(seq 1 40); do echo line $i; done; echo the cause >&2; exit 2"
    assert _run(tmp_path, "run", "gpu-contract-venv", "--", "sh", "-c", script).returncode == 2
    _run(tmp_path, "run", "check", "--", "sh", "-c", "echo all good")
    out = _run(tmp_path, "table").stdout.splitlines()
    start = out.index("==> the end of gpu-contract-venv's output (all of it: %s)"
                      % os.path.relpath(str(tmp_path / "suite-logs" / "gpu-contract-venv.log"), ROOT))
    tail = out[start + 1:out.index("==> wall time of each suite (make test's lanes run side by side: the rows add up to more than the total)")]
    assert tail[-1] == "    the cause" and tail[0] == "    line 12" and len(tail) == 30
    assert not any("all good" in line for line in out)
    assert (tmp_path / "suite-logs" / "check.log").read_text() == "all good\n"


def test_a_suite_s_output_still_reaches_the_console(tmp_path):
    proc = _run(tmp_path, "run", "unit", "--", "sh", "-c", "echo to stdout; echo to stderr >&2")
    assert proc.stdout.splitlines() == ["to stdout", "to stderr"]


def test_the_lines_that_name_an_error_come_before_the_tail(tmp_path):
    """make check prints its gates whole one after the other: a sanity ERROR sat 70 lines above
    the end of check's output, behind the unit tests' coverage table (rehearsal, 2026-12-07)."""
    script = ("echo 'Running sanity test pep8'; echo 'ERROR: Found 1 pep8 issue(s)'; "
              "for i in $(seq 1 40); do echo coverage row $i; done; exit 2")
    _run(tmp_path, "run", "check", "--", "sh", "-c", script)
    out = _run(tmp_path, "table").stdout.splitlines()
    errors = out.index("    (lines above that name an error)")
    assert out[errors + 1] == "    ERROR: Found 1 pep8 issue(s)"
    assert out[errors + 2] == "    (the last 30 lines)"
    assert out[out.index("==> wall time of each suite (make test's lanes run side by side: the rows add up to more "
                         "than the total)") - 1] == "    coverage row 40"


def test_a_long_failure_message_takes_a_few_lines_and_no_more(tmp_path):
    long = "x" * 2000
    (tmp_path / "j.xml").write_text(JUNIT.replace("AssertionError: 1 ok, 2 failed", long))
    _run(tmp_path, "junit", "lab test", str(tmp_path / "j.xml"))
    out = _run(tmp_path, "table").stdout.splitlines()
    why = out[out.index("==> why (the first of each failed suite's errors; all of them: build/suite-logs/)") + 1:-1]
    assert len(why) == 4 and all(len(line) <= 200 for line in why)
    assert why[0].startswith("lab test test_faults.py::b: xxx") and why[-1].endswith("...")

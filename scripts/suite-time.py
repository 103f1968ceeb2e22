#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wall time of each suite of `make test`, and the table `.ci/run` ends with (issue #39).

    suite-time.py run NAME -- COMMAND...   run COMMAND, append NAME's wall time and result
    suite-time.py junit PREFIX FILE.xml    append one row per test file of a JUnit report
                                           (pytest's --junitxml: setup, call and teardown)
    suite-time.py table [--total SECONDS]  print the table of every row so far

Rows go to $KVCACHE_BUILD_DIR/suite-times.tsv (name, seconds, result), one line per suite,
appended as each ends; the make lanes run side by side, so the suites' times add up to more
than the run's wall time, which the table's last line gives (.ci/run measures it). Each suite's
output is also kept in $KVCACHE_BUILD_DIR/suite-logs/<name>.log, and the table repeats the last
lines of every failed suite's: a lane prints a suite when it ends, often an hour before the run
does, and a CI log is read from its end. A CI log keeps only its last ~34 lines: the table is
printed two rows to a line, and its last lines before the count say why each failed suite
failed (a JUnit report's failure messages, else the first line that names an error).
"""
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How much of a failed suite's output the table repeats: its last lines, and before them the
# first lines above those that name an error (ansible-test's ERROR:, pytest's FAILED, Ansible's
# fatal:, make's Error).
TAIL_LINES = 30
ERROR_LINES = 20
ERROR_LINE = re.compile(r"^(ERROR|FATAL)[: ]|^FAILED |fatal: \[|\*\*\* \[.*\] Error |^E  ")
# The closing "why" lines: at most WHY_LINES, each at most WHY_WIDTH characters; one failure's
# message may take WHY_WRAP of them (an assertion's message says what the test saw).
WHY_LINES = 14
WHY_WIDTH = 200
WHY_WRAP = 4


def _rows_file():
    build = os.environ.get("KVCACHE_BUILD_DIR") or os.path.join(ROOT, "build")
    os.makedirs(build, exist_ok=True)
    return os.path.join(build, "suite-times.tsv")


def _append(name, seconds, result):
    with open(_rows_file(), "a") as handle:
        handle.write("%s\t%.0f\t%s\n" % (name, seconds, result))


def _failures_file():
    return os.path.join(os.path.dirname(_rows_file()), "suite-failures.tsv")


def _one_line(text, width):
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _log_lines(name):
    """A suite's kept output, as lines ([] when it has none)."""
    if not os.path.exists(_log_file(name)):
        return []
    with open(_log_file(name), "rb") as handle:
        return handle.read().decode("utf-8", "replace").splitlines()


def _log_file(name):
    """Where a suite's whole output is kept: build/suite-logs/<name>.log."""
    logs = os.path.join(os.path.dirname(_rows_file()), "suite-logs")
    os.makedirs(logs, exist_ok=True)
    return os.path.join(logs, re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".log")


def run(name, argv):
    """Run one suite; its output goes on to our stdout (stderr merged) and into its log."""
    start = time.monotonic()
    with open(_log_file(name), "wb") as log:
        try:
            # close_fds=False: a make under it keeps the parent make's jobserver (-j2)
            proc = subprocess.Popen(argv, close_fds=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            sys.stderr.write("suite-time: %s: %s\n" % (name, exc))
            log.write(("suite-time: %s: %s\n" % (name, exc)).encode())
            code = 127
        else:
            out = getattr(sys.stdout, "buffer", sys.stdout)
            for line in iter(proc.stdout.readline, b""):
                out.write(line)
                out.flush()
                log.write(line)
            proc.stdout.close()
            code = proc.wait()
    _append(name, time.monotonic() - start, "passed" if code == 0 else "FAILED (exit %d)" % code)
    return code


def junit(prefix, path):
    """One row per test file: the sum of its test cases' times, failed if any case failed."""
    per_file, failures = {}, []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("file") or (case.get("classname") or "?").replace(".", "/") + ".py"
        name = os.path.basename(name)
        seconds, failed = per_file.get(name, (0.0, False))
        bad = [child for child in case if child.tag in ("failure", "error")]
        per_file[name] = (seconds + float(case.get("time") or 0), failed or bool(bad))
        for child in bad:
            # pytest's message is the exception's first lines; the text is the traceback
            traceback = (child.text or "").strip().splitlines()
            why = child.get("message") or (traceback[-1] if traceback else child.tag)
            failures.append("%s %s\t%s\t%s\n" % (prefix, name, case.get("name"), _one_line(why, 1000)))
    if failures:
        with open(_failures_file(), "a") as handle:
            handle.writelines(failures)
    for name in sorted(per_file):
        seconds, failed = per_file[name]
        _append("%s %s" % (prefix, name), seconds, "FAILED" if failed else "passed")
    return 0


def _why(rows):
    """One line per failed test of a JUnit row, else the failed suite's first error line."""
    junit_failures = []
    if os.path.exists(_failures_file()):
        with open(_failures_file()) as handle:
            junit_failures = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    why = []
    for name, _seconds, result in rows:
        if result == "passed":
            continue
        mine = [f for f in junit_failures if f[0] == name]
        if mine:
            why.extend("%s::%s: %s" % (name, test, message) for _name, test, message in mine)
            continue
        lines = _log_lines(name)
        errors = [line for line in lines if ERROR_LINE.search(line)] or [l for l in lines if l.strip()][-1:]
        why.append("%s (%s): %s" % (name, result, errors[0] if errors else "no output"))
    return why


def table(total=None):
    path = _rows_file()
    rows = []
    if os.path.exists(path):
        with open(path) as handle:
            rows = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    width = max([len(r[0]) for r in rows] + [len("suite")])
    # A failed suite's last lines come last but for the table: the part of a CI log people see
    # first is its end, and the lanes print each suite whole, long before the run ends.
    for name, _seconds, result in rows:
        log = _log_file(name)
        if result != "passed" and os.path.exists(log):
            lines = _log_lines(name)
            print("==> the end of %s's output (all of it: %s)" % (name, os.path.relpath(log, ROOT)))
            # make's gates print whole, one after the other: the failing one's lines may sit far
            # above the end, so the lines that name an error come first.
            errors = [line for line in lines[:-TAIL_LINES] if ERROR_LINE.search(line)][:ERROR_LINES]
            if errors:
                print("    (lines above that name an error)")
                for line in errors:
                    print("    " + line)
                print("    (the last %d lines)" % TAIL_LINES)
            for line in lines[-TAIL_LINES:]:
                print("    " + line)
    print("==> wall time of each suite (make test's lanes run side by side: the rows add up to more than the total)")
    cells = ["%-*s  %6s  %s" % (width, name, seconds, "passed" if result == "passed" else "FAILED")
             for name, seconds, result in rows]
    cell_width = max([len(c) for c in cells] + [0])
    for i in range(0, len(cells), 2):
        print("  ".join(c.ljust(cell_width) for c in cells[i:i + 2]).rstrip())
    if total is not None:
        print("%s  %6d  (%.1f min)" % ("total (.ci/run wall time)".ljust(width), int(total), total / 60.0))
    why = _why(rows)
    if why:
        print("==> why (the first of each failed suite's errors; all of them: build/suite-logs/)")
        lines = []
        for one in why:
            text = " ".join(one.split())
            chunks = [text[i:i + WHY_WIDTH] for i in range(0, len(text), WHY_WIDTH)] or [""]
            if len(chunks) > WHY_WRAP:
                chunks = chunks[:WHY_WRAP - 1] + [_one_line(text[(WHY_WRAP - 1) * WHY_WIDTH:], WHY_WIDTH)]
            lines.extend(chunks)
        for line in lines[:WHY_LINES]:
            print(line)
    failed = sum(1 for row in rows if row[2] != "passed")
    print("suites: %d passed, %d failed" % (len(rows) - failed, failed))
    return 0


def main(argv):
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        return run(argv[1], argv[3:])
    if len(argv) == 3 and argv[0] == "junit":
        return junit(argv[1], argv[2])
    if argv and argv[0] == "table":
        total = float(argv[2]) if len(argv) == 3 and argv[1] == "--total" else None
        return table(total)
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

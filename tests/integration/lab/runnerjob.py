"""One run of site.yml on the lab through ansible-runner, shared by test_runner.py and test_secrets.py.

The run is made the way a portal would make it (examples/runner/kvcache_runner.py): a
private_data_dir in a temp dir whose project/ is this checkout and inventory/ the lab's,
ANSIBLE_COLLECTIONS_PATH as in the Makefile, verbosity 3 (-vvv, so test_secrets.py can search
the most talkative output there is), and validation_report_dir inside the job's artifact
directory. It runs once per pytest process, whichever test asks first; the temp dir is
removed when the process exits (KVCACHE_KEEP_RUNNER_ARTIFACTS=1 keeps it and says where).
"""
import atexit
import glob
import json
import os
import shutil
import sys
import tempfile
import time

from labutil import ROOT

sys.path.insert(0, os.path.join(ROOT, "examples", "runner"))
import kvcache_runner  # noqa: E402  pylint: disable=wrong-import-position,import-error

IDENT = "lab-site"
PLAYBOOK = "site.yml"
VERBOSITY = 3
# The lab is converged before the tests run: a rerun of site.yml took 106 s here.
JOB_TIMEOUT = 1800
_RUNS = {}


def _cleanup(path):
    if os.environ.get("KVCACHE_KEEP_RUNNER_ARTIFACTS") == "1":
        sys.stderr.write("runnerjob: kept %s\n" % path)
        return
    shutil.rmtree(path, ignore_errors=True)


def site_run():
    """The finished job: dict with pdd, ident, runner, summary, events, seconds, artifact_dir."""
    if "site" in _RUNS:
        return _RUNS["site"]
    pdd = tempfile.mkdtemp(prefix="kvcache-runner-")
    atexit.register(_cleanup, pdd)
    kvcache_runner.prepare_private_data_dir(
        pdd, ROOT, os.path.join(ROOT, "inventories", "lab"), IDENT,
        collections_path=os.path.join(ROOT, "build", "collections"),
        envvars={"ANSIBLE_HOME": os.path.join(ROOT, "build", "ansible-home"),
                 "ANSIBLE_LOCAL_TEMP": os.path.join(ROOT, "build", "ansible-home", "tmp")},
        settings={"job_timeout": JOB_TIMEOUT, "idle_timeout": 900})
    started = time.monotonic()
    runner, summary = kvcache_runner.run_job(pdd, IDENT, playbook=PLAYBOOK, verbosity=VERBOSITY)
    adir = kvcache_runner.artifact_dir(pdd, IDENT)
    events = []
    for path in glob.glob(os.path.join(adir, "job_events", "*.json")):
        with open(path, encoding="utf-8") as handle:
            events.append(json.load(handle))
    events.sort(key=lambda e: e["counter"])
    _RUNS["site"] = {
        "pdd": pdd, "ident": IDENT, "runner": runner, "summary": summary, "events": events,
        "seconds": round(time.monotonic() - started, 1), "artifact_dir": adir,
    }
    return _RUNS["site"]


def _mask(text):
    """text with the lab's secrets (build/lab/secrets/*) replaced by their file names."""
    for name in glob.glob(os.path.join(ROOT, "build", "lab", "secrets", "*")):
        with open(name, encoding="utf-8") as handle:
            value = handle.read().strip()
        if value:
            text = text.replace(value, "<%s>" % os.path.basename(name))
    return text


def failed_tasks(run):
    """One line per failed (not ignored) or unreachable task event: host, task, message (secrets masked)."""
    lines = []
    for event in run.get("events", []):
        if event.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
            continue
        data = event.get("event_data", {})
        if data.get("ignore_errors"):
            continue
        res = data.get("res") or {}
        msg = res.get("msg") or res.get("stderr") or ""
        if not isinstance(msg, str):
            msg = json.dumps(msg, default=str)
        lines.append(_mask("%s | %s | %s" % (data.get("host"), data.get("task"), msg[:1500])))
    return lines


def report_failures(run):
    """The validation report's stages that did not pass: 'id status: reason [causes]' lines."""
    lines = []
    for path in glob.glob(os.path.join(run["artifact_dir"], "**", "validation-latest.json"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
        for stage in report.get("stages", []):
            if stage.get("status") != "pass":
                causes = [c.get("id", c) if isinstance(c, dict) else c for c in stage.get("causes", [])]
                lines.append(_mask("%s %s: %s %s" % (stage.get("id"), stage.get("status"), stage.get("reason"),
                                                     causes)))
    return lines


def stdout_tail(run, chars=4000):
    """For assertion messages: the failed tasks and the report's failed stages first, then the
    end of the job's stdout (without the timing summary), secrets masked."""
    path = os.path.join(run["artifact_dir"], "stdout")
    failed = failed_tasks(run)
    stages = report_failures(run)
    head = ("failed tasks:\n" + "\n".join(failed) + "\n\n") if failed else ""
    head += ("validation stages not passed:\n" + "\n".join(stages) + "\n\n") if stages else ""
    if not os.path.exists(path):
        return head + "(no stdout artifact)"
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    # The profile_tasks summary at the end says nothing about a failure: cut it off.
    recap_end = text.find("\n\n", text.rfind("PLAY RECAP")) if "PLAY RECAP" in text else -1
    if recap_end != -1:
        text = text[:recap_end]
    return head + _mask(text[-chars:])

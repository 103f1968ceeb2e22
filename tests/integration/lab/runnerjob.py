"""The one run of site.yml on the lab through ansible-runner that test_runner.py and test_secrets.py
read: the execution environment's run (eejob.site_run(), which test_execution_environment.py
reads too), made the way a portal makes it: ansible-runner with process isolation, verbosity 3
(-vvv, so test_secrets.py can search the most talkative output there is), validation_report_dir
inside the job's artifact directory. It runs once per pytest process, whichever test asks first;
its temp dir is removed when the process exits (KVCACHE_KEEP_RUNNER_ARTIFACTS=1 keeps it).

Until issue #39 the controller ran a second site.yml job of its own here (ansible-runner on the
checkout, about 3 minutes), proving the same of the same roles. What only the controller's
runner path has is still run on the controller: the example's documented command line
(test_runner.py, through playbooks/validate.yml) and its vault prompt.
"""
import glob
import json
import os

import eejob

IDENT = eejob.SITE_IDENT
VERBOSITY = eejob.VERBOSITY


def site_run():
    """The finished job: dict with pdd, ident, runner, summary, events, seconds, artifact_dir."""
    return eejob.site_run()


def _mask(text):
    """text with the lab's secrets (build/lab/secrets/*) replaced by their file names."""
    return eejob.mask(text, eejob.lab_secrets())


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

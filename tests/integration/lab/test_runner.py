"""site.yml on the lab through ansible-runner, as a portal runs it (docs/ansible-runner.md).

One ansible_runner.run() of site.yml: the execution environment's (runnerjob.py -> eejob.py;
process isolation, the collection installed in the EE, verbosity 3), shared with
test_execution_environment.py and test_secrets.py. site.yml ends with the validate play
(playbooks/site.yml imports playbooks/validate.yml last), so that one run is also the
validate.yml run: the tests check from the event stream that the validation play ran, last,
and find its report among the job's artifacts (validation_report_dir is an extravar pointing
into artifacts/<ident>/).

The lab is converged before the tests run (`make lab`), so the run must change nothing.
The controller's own runner path (examples/runner/kvcache_runner.py from a fresh shell, and
its vault prompt) runs here too, on playbooks/validate.yml and a local playbook.
"""
import glob
import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest

import runnerjob
from faultutil import report_shape
from labutil import ROOT, container_name, docker_exec, group_hosts

sys.path.insert(0, os.path.join(ROOT, "examples", "runner"))
import kvcache_runner  # noqa: E402  pylint: disable=wrong-import-position,import-error

STAGES = ["instances", "tier_write", "local_hit", "cross_instance", "router", "lmcache_probe", "gds_path", "routing"]
# What the lab's report must say of each stage: GDS is off in the lab (no GPU, no nvidia-fs), so
# stage 7 is skipped with its reason and every other stage passes (stage 8, routing, too: the
# lab's round_robin is judged informational).
EXPECTED = dict((sid, "skipped" if sid == "gds_path" else "pass") for sid in STAGES)
VALIDATE_PLAY = "Validate the cache tiers"
CA_TRUST_PLAY = "Site CA certificates on every host"


@pytest.fixture(scope="module")
def site(instances):  # pylint: disable=unused-argument
    """The runner job (instances: the lab answers, else the fixture fails first)."""
    return runnerjob.site_run()


def _events(site, name):
    return [e for e in site["events"] if e.get("event") == name]


def _schema():
    with open(os.path.join(ROOT, "docs", "validation-report.md"), encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(r"<!-- schema -->\s*```json\n(.*?)\n```", text, re.S)
    assert match, "docs/validation-report.md lost its schema block"
    return json.loads(match.group(1))


def test_runner_status_rc_and_artifacts_are_where_documented(site):
    runner, summary, adir = site["runner"], site["summary"], site["artifact_dir"]
    tail = runnerjob.stdout_tail(site)
    assert runner.status == "successful", tail
    assert runner.rc == 0, tail
    assert adir == os.path.join(site["pdd"], "artifacts", site["ident"])
    for name, expected in (("rc", "0"), ("status", "successful")):
        with open(os.path.join(adir, name), encoding="utf-8") as handle:
            assert handle.read().strip() == expected
    assert os.path.getsize(os.path.join(adir, "stdout")) > 0
    with open(os.path.join(adir, "command"), encoding="utf-8") as handle:
        command = json.load(handle)
    # process isolation: docker runs ansible-playbook in the EE image, -vvv
    assert command["command"][:2] == ["docker", "run"], command["command"][:6]
    assert "ansible-playbook" in command["command"] and "-vvv" in command["command"], command["command"]
    assert summary["status"] == "successful" and summary["rc"] == 0
    print("site.yml through ansible-runner took %s s" % site["seconds"])


def test_event_stream_says_nothing_failed_and_nothing_changed(site):
    stats = _events(site, "playbook_on_stats")
    assert len(stats) == 1, "one playbook_on_stats event expected"
    data = stats[0]["event_data"]
    lab_hosts = {"lab-monitor", "lab-node1", "lab-node2", "lab-router", "lab-s3", "localhost"}
    assert lab_hosts <= set(data["ok"]), data["ok"]
    assert data["failures"] == {}, runnerjob.failed_tasks(site)
    assert data["dark"] == {}, runnerjob.failed_tasks(site)
    changed = {h: n for h, n in data["changed"].items() if n}
    assert runnerjob.failed_tasks(site) == [], runnerjob.stdout_tail(site)
    changed_tasks = [(e["event_data"]["host"], e["event_data"]["task"]) for e in _events(site, "runner_on_ok")
                     if e["event_data"].get("res", {}).get("changed")]
    assert changed == {}, "the lab is converged, yet the run changed: %s" % changed_tasks


def test_every_stage_ran_and_validation_came_last(site):
    plays = [e["event_data"]["play"] for e in _events(site, "playbook_on_play_start")]
    assert plays, "no play started"
    assert plays[-1] == VALIDATE_PLAY, plays
    for expected in ("Preflight checks on every host of the platform", "Pruning timer for the shared fs tier",
                     "Monitoring configuration from the inventory"):
        assert expected in plays, (expected, plays)


def test_ca_trust_runs_once_per_host_in_host_preparation(site):
    """site.yml trusts the site's CAs on every host in one play of host preparation; the roles
    that include ca_trust again later in the run (inference_env, router, s3_store) skip it."""
    certificates = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))  # the lab's ca_trust_certificates
    copies = [(e["event_data"]["host"], e["event_data"]["play"]) for e in _events(site, "runner_on_ok")
              if e["event_data"].get("task") == "Copy the CA certificates"]
    if not certificates:
        assert copies == [], "no certificate to trust, yet the role copied: %s" % copies
        return
    assert sorted(copies) == [(host, CA_TRUST_PLAY) for host in ("lab-node1", "lab-node2", "lab-router", "lab-s3")], copies


def test_validation_report_is_among_the_artifacts_and_passes(site):
    report_dir = kvcache_runner.report_dir(site["pdd"], site["ident"])
    assert report_dir.startswith(site["artifact_dir"] + os.sep)
    names = sorted(os.listdir(report_dir))
    assert "validation-latest.json" in names and "validation-latest.md" in names, names
    stamped = [n for n in names if n.startswith("validation-") and "latest" not in n]
    assert len(stamped) == 2, "one timestamped JSON + Markdown pair for one run: %s" % names
    with open(os.path.join(report_dir, "validation-latest.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    jsonschema.validate(report, _schema())
    assert report["schema"] == "kvcache.offload/validation-report"
    assert "validation-%s.json" % report["run"]["id"] in names
    statuses = {s["id"]: s["status"] for s in report["stages"]}
    assert statuses == EXPECTED, [
        (s["id"], s["status"], s["reason"]) for s in report["stages"] if s["status"] != EXPECTED.get(s["id"])]
    assert report["result"] == "pass" and report["failed_required"] == []
    with open(os.path.join(report_dir, "validation-latest.md"), encoding="utf-8") as handle:
        markdown = handle.read()
    assert report["run"]["id"] in markdown
    # The summary the example prints for a portal points at the same files.
    assert site["summary"]["report"]["json"] == os.path.join(report_dir, "validation-latest.json")
    assert site["summary"]["report"]["result"] == "pass"


def test_validation_report_keeps_its_shape(site):
    """The same stages, statuses, numbers' and details' keys as the lab's report before the
    one-path redesign of the validation role (fixtures/validation-report-shape.json); node rows
    may have gained keys (validated, reason), never lost one."""
    report_dir = kvcache_runner.report_dir(site["pdd"], site["ident"])
    with open(os.path.join(report_dir, "validation-latest.json"), encoding="utf-8") as handle:
        shape = report_shape(json.load(handle))
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "validation-report-shape.json"), encoding="utf-8") as handle:
        before = json.load(handle)
    assert set(before.pop("nodes")) <= set(shape.pop("nodes")), "a node row lost a key"
    assert shape == before


def test_operations_are_deployed_by_site(site, inventory, hostvars):
    """site.yml imports operations.yml: the pruning timer on the first node, scrape config on the controller."""
    nodes = group_hosts(inventory, "kvcache_nodes")
    first, others = nodes[0], nodes[1:]
    out = docker_exec(container_name(hostvars, first), "systemctl", "show", "-p", "ActiveState,UnitFileState",
                      "kvcache-prune.timer", timeout=30).stdout.split()
    assert out == ["ActiveState=active", "UnitFileState=enabled"], out
    for host in others:
        proc = docker_exec(container_name(hostvars, host), "test", "-e", "/etc/systemd/system/kvcache-prune.timer",
                           timeout=30, check=False)
        assert proc.returncode != 0, "%s must not prune the shared volume too" % host
    monitoring = os.path.join(ROOT, "build", "lab", "monitoring")  # inventories/lab/group_vars/kvcache_monitoring
    with open(os.path.join(monitoring, "targets", "vllm.json"), encoding="utf-8") as handle:
        vllm_targets = sorted(t for group in json.load(handle) for t in group["targets"])
    expected = sorted("%s:%d" % (hostvars[h]["ansible_host"], i["port"]) for h in nodes for i in hostvars[h]["vllm_instances"])
    assert vllm_targets == expected
    assert os.path.exists(os.path.join(monitoring, "scrape-kvcache.yml"))
    assert os.path.exists(os.path.join(monitoring, "grafana", "kvcache-dashboard.json"))
    assert site["summary"]["stats"]["ok"].get("localhost", 0) > 0


def test_vault_password_is_answered_from_memory(tmp_path):
    """The example's vault path: --ask-vault-pass answered by runner, nothing written to env/."""
    secret = "vaulted-%s" % os.urandom(6).hex()
    password = "pw-%s" % os.urandom(6).hex()
    project, inventory = tmp_path / "project", tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    project.mkdir()
    (project / "check.yml").write_text(
        "- name: Check the vaulted variable\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Compare\n      ansible.builtin.assert:\n        that: vaulted == lookup('ansible.builtin.env', 'EXPECTED')\n"
        "      no_log: true\n")
    (inventory / "hosts").write_text("localhost ansible_connection=local ansible_python_interpreter=%s\n" % sys.executable)
    pwfile = tmp_path / "pw"
    pwfile.write_text(password)
    encrypted = subprocess.run(
        ["ansible-vault", "encrypt_string", "--vault-password-file", str(pwfile), secret, "--name", "vaulted"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    pwfile.unlink()
    (inventory / "group_vars" / "all" / "vault.yml").write_text(encrypted)
    pdd = tmp_path / "pdd"
    for ident, given, want in (("good", password, 0), ("bad", password + "x", 2)):
        kvcache_runner.prepare_private_data_dir(str(pdd), str(project), str(inventory), ident,
                                                envvars={"EXPECTED": secret})
        runner, summary = kvcache_runner.run_job(str(pdd), ident, playbook="check.yml", vault_password=given)
        assert runner.rc == want, runnerjob.stdout_tail({"artifact_dir": summary["artifact_dir"]})
    assert sorted(os.listdir(pdd / "env")) == ["envvars", "extravars", "settings"]
    for dirpath, _dirs, files in os.walk(pdd):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    assert password.encode() not in handle.read(), path


def test_the_documented_command_validates_the_lab_from_a_fresh_shell(tmp_path, instances):  # pylint: disable=unused-argument
    """docs/ansible-runner.md's command line, literally: the venv's Python, no venv on PATH.

    Before the example put its interpreter's bin directory on the job's PATH, this job ended
    with status failed, rc 127 (ansible-runner could not find ansible-playbook).
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1", "LMCACHE_TRACK_USAGE": "false"}
    proc = subprocess.run(
        [os.path.join(ROOT, "build", "venv", "bin", "python"), os.path.join(ROOT, "examples", "runner", "kvcache_runner.py"),
         "--private-data-dir", str(tmp_path / "jobs" / "42"), "--ident", "job-42",
         "--project-dir", ROOT, "--inventory", os.path.join(ROOT, "inventories", "lab"),
         "--collections-path", os.path.join(ROOT, "build", "collections"),
         "--playbook", "playbooks/validate.yml"],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["rc"], summary["failed_tasks"]) == ("successful", 0, []), summary
    assert summary["report"]["result"] == "pass", summary["report"]
    assert summary["report"]["json"].startswith(str(tmp_path / "jobs" / "42" / "artifacts" / "job-42" / "validation"))
    # The validation's set_stats data, what AWX shows as the job's artifacts (docs/awx.md).
    handed = summary["artifacts"]["kvcache_validation"]
    assert handed["result"] == "pass", handed
    assert os.path.dirname(handed["report_json"]) == os.path.dirname(summary["report"]["json"]), handed
    assert os.path.isfile(handed["report_json"]) and os.path.isfile(handed["report_markdown"]), handed
    assert handed["stages"] == EXPECTED, handed

"""site.yml from the execution environment (EE), as a portal runs it (#23 item 3).

ansible-runner with process isolation (`docker run` of the EE image `make ee` builds,
kvcache-offload/ee:current) runs the collection's site playbook, kvcache.offload.site from the
copy installed in the image, never the checkout: the job's project holds only a site.yml
that imports it and an ansible.cfg derived from the checkout's (no collections_path, no
inventory, no home). How the job reaches the lab (docs/execution-environment.md):

- the lab's hosts are containers reached through the docker socket, mounted into the EE; the
  image has no docker CLI, so an inventory source of the job's own sets the docker_api
  connection (community.docker, in the image) on every kvcache_lab host, as host vars that
  win over the lab's group_vars;
- the lab inventory (inventories/lab), its state directory (build/lab: pip-sources.json) and
  each secret file the inventory reads (build/lab/secrets/*) are mounted read-only at their
  own paths, as are the machine's extra CA certificates (the lab's ca_trust_certificates);
  the secrets' directory itself is an empty one of the job's (ansible.builtin.password takes
  a lock file next to the file it reads, even when it only reads);
- the lab-only S3 store role (roles/s3_store, not in the collection tarball) is mounted
  read-only into the EE's installed kvcache.offload for the lab's kvcache_s3_store host;
- the EE runs on the host's network (the controller's validation probes and the storage
  stage reach the lab's addresses);
- validation_report_dir points into the job's artifacts; build/lab stays read-only, and the
  site run's monitoring output lands in a writable copy mounted over build/lab/monitoring.

Lab tests (need `make lab` and `make ee`): one run succeeds and, on the lab `make lab` converged
from the controller, changes nothing (it is a rerun),
the validation report lands in the job's artifacts and passes, and no lab secret
(build/lab/secrets/*) appears in any file the jobs left (artifacts, job_events included).
Run only them: build/venv/bin/python -m pytest tests/integration/lab/test_execution_environment.py
(make lab first; about 2 minutes for the run).

Without the lab: the same runner invocation (ee_job) on a localhost playbook in the EE, and
the secret scanner against a planted canary; `-k "not test_lab_"` runs only those.
"""
import configparser
import glob
import json
import os
import shutil
import subprocess
import tempfile

import pytest
import yaml

import eejob
from eejob import (CHECKOUT_ONLY_KEYS, CONNECTION, CONTAINER_PDD, EE_COLLECTION_ROLES, IMAGE, SECRETS_DIR, ee_job,
                   job_ansible_cfg, lab_job, lab_secrets, secret_hits)
from eejob import failed as _failed
from eejob import image_or_fail as _image_or_fail
from eejob import stats as _stats
from eejob import stdout_tail as _stdout_tail
from labutil import ROOT

SMOKE_DIR = os.path.join(ROOT, "tests", "integration", "ee")


@pytest.fixture(name="pdd")
def fixture_pdd():
    path = tempfile.mkdtemp(prefix="kvcache-ee-job-")
    yield path
    if os.environ.get("KVCACHE_KEEP_RUNNER_ARTIFACTS") == "1":
        print("kept %s" % path)
    else:
        shutil.rmtree(path, ignore_errors=True)


# --- Without the lab ------------------------------------------------------------------------


def test_the_secret_scanner_finds_a_planted_secret(tmp_path):
    """secret_hits must find a secret wherever it lies (nested, inside JSON), else the lab
    test's zero hits prove nothing."""
    secrets = {"canary": "Kv" + "cache" + "Canary" + "0123456789abcdef"}
    (tmp_path / "job_events").mkdir()
    (tmp_path / "job_events" / "1-x.json").write_text(json.dumps({"stdout": "key=%s" % secrets["canary"]}))
    (tmp_path / "stdout").write_text("nothing here")
    hits, scanned = secret_hits(str(tmp_path), secrets)
    assert scanned == 2
    assert hits == [(os.path.join("job_events", "1-x.json"), "canary")]
    (tmp_path / "job_events" / "1-x.json").write_text("{}")
    assert secret_hits(str(tmp_path), secrets) == ([], 2)


def test_job_ansible_cfg_drops_what_points_into_the_checkout():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(job_ansible_cfg())
    keys = {k for s in cfg.sections() for k, _v in cfg.items(s)}
    assert not keys & set(CHECKOUT_ONLY_KEYS), keys
    assert cfg.get("defaults", "gathering") == "explicit"  # the rest is kept
    assert cfg.get("connection", "pipelining") == "true"


def test_runner_in_the_ee_runs_the_collection_on_localhost(pdd):
    """The portal invocation (ee_job) on a localhost playbook: the installed collection's filter
    and module work in the EE, the events and the module's report land in the job's artifacts,
    and nothing of the checkout is mounted (the collection can only come from the image)."""
    image = _image_or_fail()
    ident = "ee-smoke"
    with open(os.path.join(SMOKE_DIR, "smoke.yml"), encoding="utf-8") as handle:
        playbook = handle.read()
    with open(os.path.join(SMOKE_DIR, "inventory.yml"), encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    report_dir = "%s/artifacts/%s/validation" % (CONTAINER_PDD, ident)
    runner, adir, events = ee_job(pdd, ident, playbook, [], {"ee_smoke_report_dir": report_dir},
                                  inventory_files={"hosts.yml": inventory}, image=image)
    assert runner.status == "successful" and runner.rc == 0, _failed(events) or _stdout_tail(adir, {})
    with open(os.path.join(adir, "command"), encoding="utf-8") as handle:
        command = json.load(handle)["command"]
    assert command[:3] == ["docker", "run", "--rm"] and image in command, command
    mounts = [command[i + 1] for i, arg in enumerate(command) if arg == "-v"]
    assert mounts and not [m for m in mounts if m.split(":")[0].startswith(ROOT)], mounts
    stats = _stats(events)
    assert stats["failures"] == {} and stats["dark"] == {}
    assert stats["ok"].get("localhost", 0) >= 5, stats
    actions = {e["event_data"].get("resolved_action") or e["event_data"].get("task_action")
               for e in events if e.get("event") == "runner_on_ok"}
    assert "kvcache.offload.validation_report" in actions, actions
    with open(os.path.join(adir, "validation", "validation-ee-smoke.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["run"]["id"] == "ee-smoke"


def test_the_ee_reaches_a_container_over_the_docker_socket(pdd):
    """The lab's way in, on a container of this test's own (no lab host): the docker socket
    mounted into the EE and the docker_api connection run a command and copy a file."""
    image = _image_or_fail()
    name = "kvcache-ee-test-target-%d" % os.getpid()
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--entrypoint", "sleep",
                    "kvcache-offload/debian12-systemd:current", "600"], check=True, capture_output=True, timeout=60)
    try:
        inventory = {"all": {"hosts": {"target": {
            "ansible_connection": CONNECTION, "ansible_docker_host": name,
            "ansible_python_interpreter": "/usr/bin/python3"}}}}
        playbook = """---
- name: Reach a container over the docker socket
  hosts: target
  gather_facts: false
  tasks:
    - name: Run a command in it
      ansible.builtin.command: cat /etc/debian_version
      register: ee_target_version
      changed_when: false
    - name: Copy a file into it
      ansible.builtin.copy:
        content: "from the EE\\n"
        dest: /tmp/ee-was-here
        mode: "0644"
"""
        runner, adir, events = ee_job(pdd, "ee-docker", playbook, [], {}, image=image,
                                      mounts=["/var/run/docker.sock:/var/run/docker.sock"],
                                      inventory_files={"hosts.yml": inventory})
        assert runner.status == "successful", _failed(events) or _stdout_tail(adir, {})
        version = [e["event_data"]["res"]["stdout"] for e in events if e.get("event") == "runner_on_ok"
                   and e["event_data"].get("task") == "Run a command in it"]
        assert version and version[0].startswith("12."), version
        copied = subprocess.run(["docker", "exec", name, "cat", "/tmp/ee-was-here"], capture_output=True,
                                text=True, check=True, timeout=30).stdout
        assert copied == "from the EE\n"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False, timeout=60)


# --- Against the lab ------------------------------------------------------------------------


# Runs on localhost in the EE only (no lab host is contacted): what the lab job sees.
LAB_VIEW_PLAYBOOK = """---
- name: What a lab job sees from the EE (localhost only)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check the connection override and the lab's state directory
      ansible.builtin.assert:
        that:
          - groups['kvcache_lab'] | length >= 4
          - groups['kvcache_lab'] | map('extract', hostvars, 'ansible_connection') | unique | list == ['%(connection)s']
          - hostvars['localhost']['ansible_connection'] == 'local'
          - kvcache_lab_state_dir == '%(state_dir)s'
          - validation_report_dir.startswith('/runner/artifacts/')
          - (kvcache_lab_pip_sources.mounts | length) == (kvcache_lab_pip_sources_expected | int)
        quiet: true
    - name: Look for the lab-only S3 store role lent to the EE's collection
      ansible.builtin.stat:
        path: "%(roles)s/s3_store/tasks/main.yml"
      register: ee_s3_store_role

    - name: Check that the role is there
      ansible.builtin.assert:
        that: ee_s3_store_role.stat.exists
        quiet: true

    - name: Check that the inventory reads the lab's secrets (read-only mount)
      ansible.builtin.assert:
        that:
          - kvcache_api_key | length == 40
          - kvcache_s3_secret_key | length == 40
        quiet: true
      no_log: true
"""


def test_lab_view_from_the_ee(pdd):
    """The lab job's invocation on a localhost-only playbook: inside the EE the lab inventory
    resolves (state dir, pip sources), its secrets are readable, and every lab host gets the
    docker_api connection while localhost stays local. Contacts no lab host; needs build/lab
    (make lab, or a lab from before) and the image."""
    image = _image_or_fail()
    assert lab_secrets(), "no lab secrets in %s: make lab" % SECRETS_DIR
    with open(os.path.join(ROOT, "build", "lab", "pip-sources.json"), encoding="utf-8") as handle:
        expected_mounts = len(json.load(handle)["mounts"])
    playbook = LAB_VIEW_PLAYBOOK % {"connection": CONNECTION, "state_dir": os.path.join(ROOT, "build", "lab"),
                                    "roles": EE_COLLECTION_ROLES}
    playbook = playbook.replace("kvcache_lab_pip_sources_expected | int", str(expected_mounts))
    runner, adir, events = lab_job(pdd, "ee-lab-view", playbook, image=image)
    assert runner.status == "successful", _failed(events) or _stdout_tail(adir, lab_secrets())
    assert set(_stats(events)["ok"]) == {"localhost"}
    assert secret_hits(pdd, lab_secrets())[0] == []


@pytest.fixture(scope="module", name="ee_site")
def fixture_ee_site(instances):  # pylint: disable=unused-argument
    """The one run of kvcache.offload.site from the EE against the lab (eejob.site_run(), shared
    with test_runner.py and test_secrets.py): already a rerun of the lab `make lab` converged
    from the controller, so it must change nothing on any host."""
    site = eejob.site_run()
    run = {"ident": site["ident"], "runner": site["runner"], "artifact_dir": site["artifact_dir"],
           "events": site["events"]}
    return {"pdd": site["pdd"], "runs": [run], "secrets": site["secrets"]}


def test_lab_site_from_the_ee_succeeds(ee_site):
    first = ee_site["runs"][0]
    assert first["runner"].status == "successful" and first["runner"].rc == 0, (
        _failed(first["events"]) or _stdout_tail(first["artifact_dir"], ee_site["secrets"]))
    stats = _stats(first["events"])
    assert {"lab-monitor", "lab-node1", "lab-node2", "lab-router", "lab-s3", "localhost"} <= set(stats["ok"]), stats["ok"]
    plays = [e["event_data"]["play"] for e in first["events"] if e.get("event") == "playbook_on_play_start"]
    assert plays and plays[-1] == "Validate the cache tiers", plays
    # The lab's hosts were reached over the docker socket with the docker_api connection: the
    # image has no docker CLI, so the CLI-based docker connection could not have reached them.
    # (The job's stdout does not name the connection plugin at its verbosity.)
    cli = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", IMAGE, "-c", "command -v docker"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert cli.returncode != 0 and cli.stdout.strip() == "", cli.stdout


def test_lab_site_from_the_ee_changes_nothing_on_the_converged_lab(ee_site):
    run = ee_site["runs"][0]
    assert run["runner"].status == "successful", _failed(run["events"]) or _stdout_tail(
        run["artifact_dir"], ee_site["secrets"])
    stats = _stats(run["events"])
    changed_tasks = [(e["event_data"]["host"], e["event_data"]["task"]) for e in run["events"]
                     if e.get("event") == "runner_on_ok" and (e["event_data"].get("res") or {}).get("changed")]
    assert {h: n for h, n in stats["changed"].items() if n} == {}, changed_tasks
    # The controller's part ran against the lab's monitoring paths (not skipped): the scrape
    # configuration the controller wrote is what the job rendered, byte for byte.
    scrape = [e for e in run["events"] if e.get("event") == "runner_on_ok"
              and e["event_data"]["host"] == "localhost"
              and e["event_data"]["task"] == "Write the Prometheus scrape configuration"]
    assert len(scrape) == 1, [e["event_data"]["task"] for e in run["events"] if e.get("event") == "runner_on_ok"
                              and e["event_data"]["host"] == "localhost"]
    assert scrape[0]["event_data"]["res"]["dest"] == os.path.join(ROOT, "build", "lab", "monitoring",
                                                                  "scrape-kvcache.yml")


def test_lab_validation_report_lands_in_the_jobs_artifacts(ee_site):
    for run in ee_site["runs"]:
        report_dir = os.path.join(run["artifact_dir"], "validation")
        with open(os.path.join(report_dir, "validation-latest.json"), encoding="utf-8") as handle:
            report = json.load(handle)
        assert report["result"] == "pass", [(s["id"], s["status"], s.get("reason")) for s in report["stages"]]
        assert os.path.exists(os.path.join(report_dir, "validation-latest.md"))
        assert os.path.exists(os.path.join(report_dir, "validation-%s.json" % report["run"]["id"]))


def test_lab_no_secret_in_the_jobs_files(ee_site):
    """Every file the job left (artifacts: stdout, job_events/, command, env.list, the
    report; the job's inventory, project, monitoring output) holds none of the lab's secrets."""
    hits, scanned = secret_hits(ee_site["pdd"], ee_site["secrets"])
    events = sum(len(glob.glob(os.path.join(r["artifact_dir"], "job_events", "*.json"))) for r in ee_site["runs"])
    assert events > 100 and scanned > events, (scanned, events)
    assert hits == [], hits

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

from labutil import INVENTORY, ROOT

IMAGE = os.environ.get("KVCACHE_EE_IMAGE", "kvcache-offload/ee:current")
SECRETS_DIR = os.path.join(ROOT, "build", "lab", "secrets")
SMOKE_DIR = os.path.join(ROOT, "tests", "integration", "ee")
# Paths inside the EE container (ansible-runner mounts the private data dir at /runner).
CONTAINER_PDD = "/runner"
JOB_TIMEOUT = 1800
VERBOSITY = 3
CONNECTION = "community.docker.docker_api"
EE_COLLECTION_ROLES = "/usr/share/ansible/collections/ansible_collections/kvcache/offload/roles"
# Keys of the checkout's ansible.cfg that point into the checkout: not the EE job's.
CHECKOUT_ONLY_KEYS = ("inventory", "home", "collections_path", "collections_paths")


def _image_or_fail():
    proc = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, "the execution environment image %s is missing: make ee" % IMAGE
    return IMAGE


def job_ansible_cfg(checkout_cfg=os.path.join(ROOT, "ansible.cfg")):
    """The checkout's ansible.cfg without what points into the checkout (text of an ansible.cfg)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(checkout_cfg)
    for section in parser.sections():
        for key in CHECKOUT_ONLY_KEYS:
            parser.remove_option(section, key)
    lines = ["# Written by tests/integration/lab/test_execution_environment.py: the checkout's",
             "# ansible.cfg minus inventory, home and collections_path (the EE's collections serve)."]
    for section in parser.sections():
        lines.append("[%s]" % section)
        lines.extend("%s = %s" % (k, v) for k, v in parser.items(section))
        lines.append("")
    return "\n".join(lines)


def connection_override(lab_inventory):
    """An inventory source (dict) giving every kvcache_lab host the docker_api connection."""
    out = subprocess.run(["ansible-inventory", "-i", lab_inventory, "--list"], capture_output=True, text=True,
                         check=True, timeout=120, cwd=ROOT).stdout
    inv = json.loads(out)

    def hosts(group):
        found = list(inv.get(group, {}).get("hosts", []))
        for child in inv.get(group, {}).get("children", []):
            found += [h for h in hosts(child) if h not in found]
        return found

    lab_hosts = hosts("kvcache_lab")
    assert lab_hosts, "the lab inventory has no kvcache_lab host"
    return {"all": {"hosts": {h: {"ansible_connection": CONNECTION} for h in lab_hosts}}}


def ee_job(pdd, ident, playbook_text, inventory_args, extravars, mounts=(), network_host=False,
           inventory_files=None, image=None):
    """Lay out pdd and run one job in the EE with ansible-runner's process isolation.

    pdd/project: site.yml-like playbook_text and the job's ansible.cfg; pdd/inventory: the
    inventory_files given ({name: dict}); inventory_args: extra `-i` paths as seen inside the
    container. Returns (runner, artifact_dir, events)."""
    import ansible_runner  # pylint: disable=import-outside-toplevel

    for sub in ("project", "inventory", "env"):
        os.makedirs(os.path.join(pdd, sub), exist_ok=True)
    with open(os.path.join(pdd, "project", "playbook.yml"), "w", encoding="utf-8") as handle:
        handle.write(playbook_text)
    with open(os.path.join(pdd, "project", "ansible.cfg"), "w", encoding="utf-8") as handle:
        handle.write(job_ansible_cfg())
    for name, content in (inventory_files or {}).items():
        with open(os.path.join(pdd, "inventory", name), "w", encoding="utf-8") as handle:
            yaml.safe_dump(content, handle)
    cmdline = " ".join("-i %s" % path for path in inventory_args)
    options = ["--network=host"] if network_host else []
    runner = ansible_runner.run(
        private_data_dir=pdd, ident=ident, playbook="playbook.yml", verbosity=VERBOSITY, quiet=True,
        process_isolation=True, process_isolation_executable="docker", container_image=image or IMAGE,
        container_volume_mounts=list(mounts), container_options=options, cmdline=cmdline or None,
        extravars=extravars, envvars={"ANSIBLE_CONFIG": CONTAINER_PDD + "/project/ansible.cfg",
                                      "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"},
        settings={"job_timeout": JOB_TIMEOUT, "idle_timeout": 900, "suppress_ansible_output": True})
    adir = os.path.join(pdd, "artifacts", ident)
    events = []
    for path in glob.glob(os.path.join(adir, "job_events", "*.json")):
        with open(path, encoding="utf-8") as handle:
            events.append(json.load(handle))
    events.sort(key=lambda e: e["counter"])
    return runner, adir, events


def lab_secrets(secrets_dir=SECRETS_DIR):
    """{file name: value} of the lab's secrets."""
    found = {}
    for path in sorted(glob.glob(os.path.join(secrets_dir, "*"))):
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
        if value:
            found[os.path.basename(path)] = value
    return found


def secret_hits(root, secrets):
    """[(relative file, secret name)] for every file under root that holds a secret value."""
    hits, scanned = [], 0
    for base, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(base, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            scanned += 1
            with open(path, "rb") as handle:
                data = handle.read()
            hits += [(os.path.relpath(path, root), secret) for secret, value in secrets.items()
                     if value.encode() in data]
    return hits, scanned


def _stats(events):
    stats = [e for e in events if e.get("event") == "playbook_on_stats"]
    assert len(stats) == 1, "one playbook_on_stats event expected, got %d" % len(stats)
    return stats[0]["event_data"]


def _failed(events):
    return ["%s | %s | %s" % (e["event_data"].get("host"), e["event_data"].get("task"),
                              str((e["event_data"].get("res") or {}).get("msg", ""))[:800])
            for e in events if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
            and not e["event_data"].get("ignore_errors")]


def _mask(text, secrets):
    for name, value in secrets.items():
        text = text.replace(value, "<%s>" % name)
    return text


def _stdout_tail(adir, secrets, chars=4000):
    path = os.path.join(adir, "stdout")
    if not os.path.exists(path):
        return "(no stdout artifact)"
    with open(path, encoding="utf-8", errors="replace") as handle:
        return _mask(handle.read()[-chars:], secrets)


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


def lab_job(pdd, ident, playbook, image=None, monitoring_seed=None):
    """One job against the lab in the EE: the mounts, inventories and extra vars the module
    docstring describes. Returns ee_job()'s (runner, artifact_dir, events).

    monitoring_seed: a writable copy of the lab's monitoring output, mounted over build/lab/monitoring
    so the job writes the lab's own paths (same content as from the controller) into the copy,
    instead of a new directory of its own."""
    lab_dir, state_dir = os.path.join(ROOT, "inventories", "lab"), os.path.join(ROOT, "build", "lab")
    # The secrets directory is the job's own writable one (the password lookup that reads a
    # secret takes a lock file next to it), each secret file mounted read-only into it.
    lock_dir = os.path.join(pdd, "secrets-locks")
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    mounts = ["/var/run/docker.sock:/var/run/docker.sock",
              "%s:%s:ro" % (lab_dir, lab_dir), "%s:%s:ro" % (state_dir, state_dir),
              "%s:%s" % (lock_dir, SECRETS_DIR)]
    mounts += ["%s:%s:ro" % (os.path.join(SECRETS_DIR, n), os.path.join(SECRETS_DIR, n)) for n in lab_secrets()]
    # The lab's S3 store role does not ship in the collection (galaxy.yml build_ignore): the lab
    # job lends it to the EE's installed copy, read-only, for the lab's kvcache_s3_store host.
    mounts.append("%s:%s/s3_store:ro" % (os.path.join(ROOT, "roles", "s3_store"), EE_COLLECTION_ROLES))
    if os.path.isdir("/usr/local/share/ca-certificates"):
        mounts.append("/usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro")
    extravars = {"validation_report_dir": "%s/artifacts/%s/validation" % (CONTAINER_PDD, ident)}
    if monitoring_seed:
        mounts.append("%s:%s" % (monitoring_seed, os.path.join(state_dir, "monitoring")))
    else:
        extravars.update({"observability_output_dir": CONTAINER_PDD + "/monitoring",
                          "observability_dashboard_dir": CONTAINER_PDD + "/monitoring/grafana"})
    return ee_job(pdd, ident, playbook, [INVENTORY, CONTAINER_PDD + "/inventory/ee-connection.yml"], extravars,
                  mounts=mounts, network_host=True, image=image,
                  inventory_files={"ee-connection.yml": connection_override(INVENTORY)})


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
    """One run of kvcache.offload.site from the EE against the lab, which `make lab` converged
    from the controller: that run is already a rerun, so it must change nothing on any host.

    The controller (localhost) writes the monitoring output under build/lab, which the job sees
    read-only: it gets a writable copy of that output at the same path, so its run writes what
    the controller wrote, where the controller wrote it (a second run from the EE, as this test
    made before, repeated the first one's 3 minutes to prove the same)."""
    image = _image_or_fail()
    secrets = lab_secrets()
    assert len(secrets) >= 3, "the lab's secrets are missing from %s: make lab" % SECRETS_DIR
    pdd = tempfile.mkdtemp(prefix="kvcache-ee-site-")
    seed = os.path.join(pdd, "monitoring-seed")
    shutil.copytree(os.path.join(ROOT, "build", "lab", "monitoring"), seed)
    playbook = ("---\n- name: The kvcache.offload site playbook, from the collection installed in the EE\n"
                "  ansible.builtin.import_playbook: kvcache.offload.site\n")
    runs = []
    runner, adir, events = lab_job(pdd, "ee-site", playbook, image=image, monitoring_seed=seed)
    runs.append({"ident": "ee-site", "runner": runner, "artifact_dir": adir, "events": events})
    yield {"pdd": pdd, "runs": runs, "secrets": secrets}
    if os.environ.get("KVCACHE_KEEP_RUNNER_ARTIFACTS") == "1":
        print("kept %s" % pdd)
    else:
        shutil.rmtree(pdd, ignore_errors=True)


def test_lab_site_from_the_ee_succeeds(ee_site):
    first = ee_site["runs"][0]
    assert first["runner"].status == "successful" and first["runner"].rc == 0, (
        _failed(first["events"]) or _stdout_tail(first["artifact_dir"], ee_site["secrets"]))
    stats = _stats(first["events"])
    assert {"lab-node1", "lab-node2", "lab-router", "lab-s3", "localhost"} <= set(stats["ok"]), stats["ok"]
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

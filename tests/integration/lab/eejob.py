"""The execution environment's jobs against the lab, and the one site.yml run the lab tests share.

How a job reaches the lab from the EE: tests/integration/lab/test_execution_environment.py's
docstring. `site_run()` is the one run of kvcache.offload.site from the EE (ansible-runner with
process isolation, -vvv, the portal's path) per pytest process, whichever test asks first:
test_execution_environment.py, test_runner.py and test_secrets.py all read that job (issue #39:
it was two site.yml runs of about 3 minutes each, one from the EE and one through ansible-runner
on the controller, proving the same things of the same code).
"""
import atexit
import configparser
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

from labutil import INVENTORY, ROOT

sys.path.insert(0, os.path.join(ROOT, "examples", "runner"))
import kvcache_runner  # noqa: E402  pylint: disable=wrong-import-position,import-error

IMAGE = os.environ.get("KVCACHE_EE_IMAGE", "kvcache-offload/ee:current")
SECRETS_DIR = os.path.join(ROOT, "build", "lab", "secrets")
# Paths inside the EE container (ansible-runner mounts the private data dir at /runner).
CONTAINER_PDD = "/runner"
JOB_TIMEOUT = 1800
VERBOSITY = 3
CONNECTION = "community.docker.docker_api"
EE_COLLECTION_ROLES = "/usr/share/ansible/collections/ansible_collections/kvcache/offload/roles"
# Keys of the checkout's ansible.cfg that point into the checkout: not the EE job's.
CHECKOUT_ONLY_KEYS = ("inventory", "home", "collections_path", "collections_paths")


def image_or_fail():
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
    lines = ["# Written by tests/integration/lab/eejob.py: the checkout's",
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


def stats(events):
    """The playbook_on_stats event's data (ok, changed, failures, dark ... per host)."""
    found = [e for e in events if e.get("event") == "playbook_on_stats"]
    assert len(found) == 1, "one playbook_on_stats event expected, got %d" % len(found)
    return found[0]["event_data"]


def failed(events):
    """One line per failed (not ignored) or unreachable task event."""
    return ["%s | %s | %s" % (e["event_data"].get("host"), e["event_data"].get("task"),
                              str((e["event_data"].get("res") or {}).get("msg", ""))[:800])
            for e in events if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
            and not e["event_data"].get("ignore_errors")]


def mask(text, secrets):
    """text with every secret value replaced by its name."""
    for name, value in secrets.items():
        text = text.replace(value, "<%s>" % name)
    return text


def stdout_tail(adir, secrets, chars=4000):
    """The end of the job's stdout artifact, secrets masked."""
    path = os.path.join(adir, "stdout")
    if not os.path.exists(path):
        return "(no stdout artifact)"
    with open(path, encoding="utf-8", errors="replace") as handle:
        return mask(handle.read()[-chars:], secrets)


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


SITE_IDENT = "ee-site"
SITE_PLAYBOOK = ("---\n- name: The kvcache.offload site playbook, from the collection installed in the EE\n"
                 "  ansible.builtin.import_playbook: kvcache.offload.site\n")
_RUNS = {}


def _cleanup(path):
    if os.environ.get("KVCACHE_KEEP_RUNNER_ARTIFACTS") == "1":
        sys.stderr.write("eejob: kept %s\n" % path)
        return
    shutil.rmtree(path, ignore_errors=True)


def site_run():
    """The one run of kvcache.offload.site from the EE against the lab, which `make lab` converged
    from the controller: that run is already a rerun, so it must change nothing on any host.

    The controller (localhost) writes the monitoring output under build/lab, which the job sees
    read-only: it gets a writable copy of that output at the same path, so its run writes what
    the controller wrote, where the controller wrote it.

    Returns a dict: pdd, ident, runner, events, artifact_dir, seconds, secrets, and summary
    (examples/runner/kvcache_runner.py's summarize(), what a portal shows)."""
    if "site" in _RUNS:
        return _RUNS["site"]
    image = image_or_fail()
    secrets = lab_secrets()
    assert len(secrets) >= 3, "the lab's secrets are missing from %s: make lab" % SECRETS_DIR
    pdd = tempfile.mkdtemp(prefix="kvcache-ee-site-")
    atexit.register(_cleanup, pdd)
    seed = os.path.join(pdd, "monitoring-seed")
    shutil.copytree(os.path.join(ROOT, "build", "lab", "monitoring"), seed)
    started = time.monotonic()
    runner, adir, events = lab_job(pdd, SITE_IDENT, SITE_PLAYBOOK, image=image, monitoring_seed=seed)
    _RUNS["site"] = {
        "pdd": pdd, "ident": SITE_IDENT, "runner": runner, "events": events, "artifact_dir": adir,
        "seconds": round(time.monotonic() - started, 1), "secrets": secrets,
        "summary": kvcache_runner.summarize(pdd, SITE_IDENT, runner),
    }
    return _RUNS["site"]

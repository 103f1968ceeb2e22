# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a kvcache.offload playbook through ansible-runner, as a platform portal would.

One job = one private_data_dir (see docs/ansible-runner.md for the layout):

    <private_data_dir>/
      project/          link to the collection's checkout (site.yml, playbooks/, ansible.cfg)
      inventory/        link to the inventory directory (hosts.yml, group_vars/, host_vars/)
      env/extravars     extra variables (YAML); validation_report_dir points into the artifacts
      env/settings      runner settings: job_timeout, idle_timeout, suppress_ansible_output
      env/envvars       environment: PATH (led by the directory holding ansible-playbook),
                        ANSIBLE_COLLECTIONS_PATH, ANSIBLE_CONFIG, ANSIBLE_FORCE_COLOR
      env/cmdline       --ask-vault-pass when a vault password is given (the password itself
                        is handed to runner in memory, never written into the directory)
      artifacts/<ident>/  written by ansible-runner: rc, status, stdout, command, job_events/,
                          and validation/ (the validation report of this job)

Usage (the collection's checkout as the project, an inventory, site.yml):

    python examples/runner/kvcache_runner.py --private-data-dir /var/lib/portal/jobs/42 \\
        --project-dir /opt/kvcache.offload --inventory /etc/portal/inventories/prod \\
        --collections-path /opt/collections [--playbook site.yml] [--ident job-42] \\
        [--extravars extra.yml] [--vault-password-file /run/secrets/vault] [--verbosity 0..4]

Run it with the Python of the venv that holds ansible-core and ansible-runner (a checkout's
build/venv/bin/python after `make venv`): ansible-runner starts `ansible-playbook` by name, and
the example puts that interpreter's bin directory (or --ansible-bin-dir) first on the job's
PATH, so it works from a fresh shell where the venv is not activated.

It prints one JSON object (ident, status, rc, artifact_dir, stdout, stats, artifacts (the
play's set_stats data), failed_tasks, report) and exits with the playbook's return code (0 ok, 2 a task failed on a host,
4 a host unreachable, 254 runner timeout or cancel, 1 an error before the play ran).

Library use: prepare_private_data_dir() then run_job(); a portal can also call
ansible_runner.run() itself on a directory laid out the same way.
"""

from __future__ import absolute_import, division, print_function

import argparse
import glob
import json
import os
import shutil
import sys

__metaclass__ = type

# Where the validation report of a job goes, under the job's artifact directory.
REPORT_SUBDIR = "validation"
DEFAULT_SETTINGS = {
    # Kill the run after this many seconds (status "timeout", rc 254).
    "job_timeout": 7200,
    # ... or after this many seconds without output (a hung connection).
    "idle_timeout": 1800,
    # Do not echo Ansible's output on this process's stdout; it is in artifacts/<ident>/stdout.
    "suppress_ansible_output": True,
}


def _write(path, text, mode=0o600):
    """Write text to path, readable by the owner only (it may hold variables)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)


def _link(target, link):
    target = os.path.abspath(target)
    if os.path.islink(link):
        if os.readlink(link) == target:
            return
        os.unlink(link)
    elif os.path.exists(link):
        raise ValueError("%s exists and is not a link; give an empty private_data_dir" % link)
    os.symlink(target, link)


def artifact_dir(private_data_dir, ident):
    """The artifact directory ansible-runner uses for a job (artifacts/<ident>)."""
    return os.path.join(os.path.abspath(private_data_dir), "artifacts", ident)


def report_dir(private_data_dir, ident):
    """Where the job's validation report is written (artifacts/<ident>/validation)."""
    return os.path.join(artifact_dir(private_data_dir, ident), REPORT_SUBDIR)


def find_ansible_bin_dir(ansible_bin_dir=None, path=None):
    """The directory that holds the ansible-playbook the job runs.

    ansible_bin_dir: given by the caller (--ansible-bin-dir); must hold ansible-playbook.
    Otherwise: the bin directory of this Python (a venv's bin, not resolved through its
    symlinks), then the first ansible-playbook on path (default: this process's PATH).
    Raises ValueError naming the fix when there is none.
    """
    candidates = [ansible_bin_dir] if ansible_bin_dir else [os.path.dirname(os.path.abspath(sys.executable))]
    for directory in candidates:
        exe = os.path.join(directory, "ansible-playbook")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return os.path.abspath(directory)
    if ansible_bin_dir:
        raise ValueError("%s holds no executable ansible-playbook; give --ansible-bin-dir the bin "
                         "directory of the venv with ansible-core" % ansible_bin_dir)
    found = shutil.which("ansible-playbook", path=path if path is not None else os.environ.get("PATH", ""))
    if found:
        return os.path.dirname(os.path.abspath(found))
    raise ValueError("ansible-playbook is neither next to %s nor on PATH; run this script with the "
                     "Python of the venv that holds ansible-core and ansible-runner (build/venv/bin/python "
                     "in a checkout after `make venv`), or give --ansible-bin-dir" % sys.executable)


def prepare_private_data_dir(private_data_dir, project_dir, inventory, ident, collections_path=None,
                             extravars=None, envvars=None, settings=None, ansible_config=None,
                             ansible_bin_dir=None):
    """Lay out private_data_dir for one job; return the extra variables written.

    project_dir: the collection's checkout (or any directory holding the playbooks).
    inventory: an inventory directory or file; linked as <private_data_dir>/inventory.
    collections_path: where ansible_collections/kvcache/offload is found (ANSIBLE_COLLECTIONS_PATH).
    ansible_config: an ansible.cfg to use; default: <project_dir>/ansible.cfg when it exists.
    ansible_bin_dir: where ansible-playbook is (find_ansible_bin_dir()); it leads the job's PATH.
    """
    bin_dir = find_ansible_bin_dir(ansible_bin_dir)
    pdd = os.path.abspath(private_data_dir)
    os.makedirs(os.path.join(pdd, "env"), mode=0o700, exist_ok=True)
    os.chmod(pdd, 0o700)
    _link(project_dir, os.path.join(pdd, "project"))
    _link(inventory, os.path.join(pdd, "inventory"))

    job_extravars = {"validation_report_dir": report_dir(pdd, ident)}
    job_extravars.update(extravars or {})
    # JSON is YAML: ansible-runner reads env/* as YAML.
    _write(os.path.join(pdd, "env", "extravars"), json.dumps(job_extravars, indent=2, sort_keys=True) + "\n")

    job_settings = dict(DEFAULT_SETTINGS)
    job_settings.update(settings or {})
    _write(os.path.join(pdd, "env", "settings"), json.dumps(job_settings, indent=2, sort_keys=True) + "\n")

    # ansible-runner looks ansible-playbook up on the job's PATH (rc 127, "The command was not
    # found or was not executable: ansible-playbook", when the venv is not activated).
    path = [bin_dir] + [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir]
    job_env = {"ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "PATH": os.pathsep.join(path)}
    if ansible_config is None:
        candidate = os.path.join(os.path.abspath(project_dir), "ansible.cfg")
        ansible_config = candidate if os.path.exists(candidate) else None
    if ansible_config:
        job_env["ANSIBLE_CONFIG"] = os.path.abspath(ansible_config)
    if collections_path:
        job_env["ANSIBLE_COLLECTIONS_PATH"] = os.path.abspath(collections_path)
    job_env.update(envvars or {})
    _write(os.path.join(pdd, "env", "envvars"), json.dumps(job_env, indent=2, sort_keys=True) + "\n")
    return job_extravars


def summarize(private_data_dir, ident, runner=None):
    """What a portal shows for a finished job, read from the artifacts only."""
    adir = artifact_dir(private_data_dir, ident)

    def _read(name):
        path = os.path.join(adir, name)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()

    events = []
    for path in glob.glob(os.path.join(adir, "job_events", "*.json")):
        with open(path, encoding="utf-8") as handle:
            events.append(json.load(handle))
    events.sort(key=lambda e: e.get("counter", 0))
    stats, artifacts = {}, {}
    for event in events:
        if event.get("event") == "playbook_on_stats":
            data = event.get("event_data", {})
            stats = dict((k, data.get(k, {})) for k in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"))
            # set_stats data (the validation's kvcache_validation: result, stage statuses, paths).
            artifacts = data.get("artifact_data") or {}
    failed = [
        {"host": e["event_data"].get("host"), "task": e["event_data"].get("task"),
         "ignored": bool(e["event_data"].get("ignore_errors"))}
        for e in events if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
    ]
    report = None
    rdir = os.path.join(adir, REPORT_SUBDIR)
    latest = os.path.join(rdir, "validation-latest.json")
    if os.path.exists(latest):
        with open(latest, encoding="utf-8") as handle:
            data = json.load(handle)
        report = {
            "json": latest,
            "markdown": os.path.join(rdir, "validation-latest.md"),
            "result": data.get("result"),
            "stages": dict((s["id"], s["status"]) for s in data.get("stages", [])),
        }
    rc = _read("rc")
    return {
        "ident": ident,
        "status": runner.status if runner is not None else _read("status"),
        "rc": runner.rc if runner is not None else (int(rc) if rc not in (None, "") else None),
        "artifact_dir": adir,
        "stdout": os.path.join(adir, "stdout"),
        "events": len(events),
        "stats": stats,
        "artifacts": artifacts,
        "failed_tasks": failed,
        "report": report,
    }


def run_job(private_data_dir, ident, playbook="site.yml", verbosity=0, vault_password=None,
            event_handler=None, **kwargs):
    """Run playbook (relative to project/) for the prepared private_data_dir; return (runner, summary)."""
    import ansible_runner  # pylint: disable=import-outside-toplevel

    pdd = os.path.abspath(private_data_dir)
    # suppress_env_files: ansible_runner.run() would otherwise write the passwords and cmdline
    # given here into env/ (and never overwrite them in a later job); env/ is written by
    # prepare_private_data_dir() only.
    run_kwargs = dict(private_data_dir=pdd, ident=ident, playbook=playbook, verbosity=verbosity or None,
                      event_handler=event_handler, quiet=True, suppress_env_files=True)
    if vault_password is not None:
        # Answer ansible-playbook's vault prompt from memory: nothing lands in the directory.
        run_kwargs["cmdline"] = "--ask-vault-pass"
        run_kwargs["passwords"] = {r"^Vault password:\s*?$": vault_password}
    run_kwargs.update(kwargs)
    runner = ansible_runner.run(**run_kwargs)
    return runner, summarize(pdd, ident, runner)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--private-data-dir", required=True)
    parser.add_argument("--project-dir", required=True, help="the collection's checkout (holds site.yml)")
    parser.add_argument("--inventory", required=True, help="inventory directory or file")
    parser.add_argument("--collections-path", help="ANSIBLE_COLLECTIONS_PATH (where kvcache.offload is installed)")
    parser.add_argument("--playbook", default="site.yml", help="relative to the project (default site.yml)")
    parser.add_argument("--ident", default=None, help="job id; default: a new UUID")
    parser.add_argument("--extravars", help="YAML or JSON file of extra variables")
    parser.add_argument("--vault-password-file", help="file holding the vault password")
    parser.add_argument("--ansible-bin-dir", help="directory holding ansible-playbook (default: this Python's bin "
                        "directory, then PATH)")
    parser.add_argument("--verbosity", type=int, default=0)
    parser.add_argument("--job-timeout", type=int, default=DEFAULT_SETTINGS["job_timeout"])
    args = parser.parse_args(argv)

    ident = args.ident
    if not ident:
        import uuid  # pylint: disable=import-outside-toplevel
        ident = str(uuid.uuid4())
    extravars = {}
    vault_password = None
    try:
        if args.extravars:
            import yaml  # pylint: disable=import-outside-toplevel
            with open(args.extravars, encoding="utf-8") as handle:
                extravars = yaml.safe_load(handle) or {}
        if args.vault_password_file:
            with open(args.vault_password_file, encoding="utf-8") as handle:
                vault_password = handle.read().strip()
        prepare_private_data_dir(args.private_data_dir, args.project_dir, args.inventory, ident,
                                 collections_path=args.collections_path, extravars=extravars,
                                 settings={"job_timeout": args.job_timeout},
                                 ansible_bin_dir=args.ansible_bin_dir)
    except (OSError, ValueError) as exc:
        sys.stderr.write("kvcache_runner: %s\n" % exc)
        return 1
    runner, summary = run_job(args.private_data_dir, ident, playbook=args.playbook,
                              verbosity=args.verbosity, vault_password=vault_password)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return runner.rc if isinstance(runner.rc, int) else 1


if __name__ == "__main__":
    sys.exit(main())

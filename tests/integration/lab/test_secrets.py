"""Secrets stay secret: the lab's API key and S3 keys appear nowhere they should not.

The secrets are the lab's own (build/lab/secrets: api-key, client-api-key, s3-access-key,
s3-secret-key, s3-management-access-key, s3-management-secret-key;
in production they are in vault). Zero hits are allowed in:

- the output of site.yml run with -vvv through ansible-runner from the execution environment
  (runnerjob.py -> eejob.py, the same run test_runner.py and test_execution_environment.py
  check): every file of the job's artifact directory (stdout, job_events/,
  command, fact cache, the validation report);
- on every lab host: every file under /etc/systemd/system (whatever its mode), `systemctl
  show` of every kvcache* unit, the whole journal in verbose form (every field, not only
  the message: a secret on a command line lands in _CMDLINE), and every world-readable
  regular file under the trees the roles write to (/etc, /opt, /srv, /usr/local,
  /var/lib/kvcache*, /var/log/kvcache*, /run/kvcache*; not the uv download cache).

The secrets are handed to grep inside a container on stdin, into a root-only temp file
under /run that is removed afterwards, never on a command line; matches are reported
with the secret masked. The scanners are checked first against planted canary strings, so
a scanner that finds nothing because it is broken fails instead of passing.
"""
import os
import re

import pytest

import runnerjob
from labutil import ROOT, container_name, docker_exec, group_hosts

SECRETS_DIR = os.path.join(ROOT, "build", "lab", "secrets")
SECRET_FILES = (("api key", "api-key"), ("client key", "client-api-key"), ("S3 access key", "s3-access-key"),
                ("S3 secret key", "s3-secret-key"), ("S3 management access key", "s3-management-access-key"),
                ("S3 management secret key", "s3-management-secret-key"))
SCAN_TIMEOUT = 900
# The trees the roles write to on the hosts (roles/*/defaults, tasks, templates).
WORLD_READABLE_ROOTS = "/etc /opt /srv /usr/local /var/lib/kvcache* /var/log/kvcache* /run/kvcache*"

# $1: what to scan (files | units | journal); stdin: the patterns, one per line.
# Prints "SCANNED <n>" (files or lines looked at), then the matches.
SCANNER = r"""
set -u
umask 077
d=$(mktemp -d /run/kvcache-secret-scan.XXXXXX)
trap 'rm -rf "$d"' EXIT
cat > "$d/patterns"
[ -s "$d/patterns" ] || { echo "scanner: no patterns on stdin" >&2; exit 2; }
case "$1" in
  files)
    roots=""
    for r in ROOTS; do [ -e "$r" ] && roots="$roots $r"; done
    # shellcheck disable=SC2086
    find $roots -xdev -type f -perm -o=r -print0 2>/dev/null > "$d/list"
    echo "SCANNED $(tr -cd '\0' < "$d/list" | wc -c)"
    xargs -0 -r grep -l -s -F -f "$d/patterns" -- < "$d/list"
    ;;
  units)
    find /etc/systemd/system -type f -print0 > "$d/list"
    echo "SCANNED $(tr -cd '\0' < "$d/list" | wc -c)"
    xargs -0 -r grep -l -s -F -f "$d/patterns" -- < "$d/list"
    ;;
  journal)
    echo "SCANNED $(journalctl --no-pager -o verbose | wc -l)"
    journalctl --no-pager -o verbose | grep -F -f "$d/patterns" | cut -c1-300
    ;;
esac
exit 0
""".replace("ROOTS", WORLD_READABLE_ROOTS)


class Secrets(dict):
    """{label: value}; its repr names the labels only, so a failing test never prints a secret."""

    def __repr__(self):
        return "<secrets: %s>" % ", ".join(sorted(self))


def docker_scan(container, what, patterns):
    """(scanned count, matching lines) of the in-container scanner for the patterns."""
    proc = docker_exec_stdin(container, ["bash", "-c", SCANNER, "scan", what], "\n".join(patterns) + "\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines and lines[0].startswith("SCANNED "), proc.stdout[:500]
    return int(lines[0].split()[1]), lines[1:]


def docker_exec_stdin(container, argv, data):
    import subprocess  # pylint: disable=import-outside-toplevel
    return subprocess.run(["docker", "exec", "-i", container] + argv, input=data, capture_output=True,
                          text=True, timeout=SCAN_TIMEOUT, check=False)


def masked(text, secrets):
    for label, value in secrets.items():
        text = text.replace(value, "<%s>" % label)
    return text


def found_in(data, secrets):
    """Labels of the secrets that occur in data (str or bytes)."""
    if isinstance(data, bytes):
        return [label for label, value in secrets.items() if value.encode() in data]
    return [label for label, value in secrets.items() if value in data]


def scan_tree(path, secrets):
    """(files scanned, [(file, labels, where)]) for every regular file under path.

    where: the task an event file belongs to, or the last TASK line before the first hit in
    a text file, so that a leak can be traced to its task.
    """
    count, hits = 0, []
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.isfile(full) or os.path.islink(full):
                continue
            count += 1
            with open(full, "rb") as handle:
                data = handle.read()
            labels = found_in(data, secrets)
            if labels:
                hits.append((os.path.relpath(full, path), labels, _where(data, secrets)))
    return count, hits


def _where(data, secrets):
    text = data.decode("utf-8", "replace")
    first = min(text.find(v) for v in secrets.values() if v in text)
    task = text.rfind("TASK [", 0, first)
    if task >= 0:
        return text[task:text.find("]", task) + 1]
    found = re.search(r'"task": "([^"]*)"', text)
    return found.group(1) if found else ""


@pytest.fixture(scope="module")
def secrets():
    out = Secrets()
    for label, name in SECRET_FILES:
        path = os.path.join(SECRETS_DIR, name)
        if not os.path.exists(path):
            pytest.skip("no lab secrets in build/lab/secrets (is the lab up?)")
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
        assert len(value) >= 16, "%s is too short to search for without false hits" % label
        out[label] = value
    return out


@pytest.fixture(scope="module")
def lab_containers(inventory, hostvars):
    hosts = group_hosts(inventory, "kvcache_lab")
    assert len(hosts) >= 4
    return dict((h, container_name(hostvars, h)) for h in hosts)


@pytest.fixture(scope="module")
def canary():
    return Secrets(canary="kvcache-canary-%s" % os.urandom(12).hex())


def test_scanners_find_a_planted_string(lab_containers, canary, tmp_path):
    """Self-check: each scanner finds a planted canary, and the file scanner skips root-only files."""
    value = canary["canary"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "event.json").write_text('{"stdout": "x%sy"}' % value)
    (tmp_path / "clean").write_text("nothing here")
    assert scan_tree(str(tmp_path), canary) == (2, [("sub/event.json", ["canary"], "")])
    assert found_in("a %s b" % value, canary) == ["canary"] and found_in(b"none", canary) == []
    assert masked("key=%s" % value, canary) == "key=<canary>"

    container = sorted(lab_containers.values())[0]
    public, private, unit = ("/srv/kvcache-scan-canary-public", "/srv/kvcache-scan-canary-private",
                             "/etc/systemd/system/kvcache-scan-canary.conf")
    # The unit-tree canary is root-only: the unit scan reads every file there, the
    # world-readable scan must skip it (as it skips the private one).
    plant = ("printf '%%s\\n' '%s' > %s && chmod 0644 %s && cp -p %s %s && chmod 0600 %s && cp -p %s %s && "
             "logger -t kvcache-scan-canary 'planted %s'" % (value, public, public, public, private, private,
                                                             private, unit, value))
    try:
        docker_exec(container, "sh", "-c", plant, timeout=60)
        scanned, hits = docker_scan(container, "files", [value])
        assert scanned > 100, "the file scanner looked at %d files only" % scanned
        assert hits == [public], hits
        scanned, hits = docker_scan(container, "units", [value])
        assert scanned >= 1 and hits == [unit], hits
        # The journal may take a moment to get the logger line.
        for dummy in range(10):
            scanned, hits = docker_scan(container, "journal", [value])
            if hits:
                break
            docker_exec(container, "sleep", "1", timeout=10)
        assert scanned > 0 and any(value in h for h in hits), hits
    finally:
        docker_exec(container, "rm", "-f", public, private, unit, timeout=60, check=False)


def test_vvv_run_output_has_no_secret(secrets, instances):  # pylint: disable=unused-argument
    site = runnerjob.site_run()
    tail = runnerjob.stdout_tail(site)
    assert site["runner"].rc == 0, masked(tail, secrets)
    with open(os.path.join(site["artifact_dir"], "stdout"), encoding="utf-8", errors="replace") as handle:
        stdout = handle.read()
    # Proof that the output is really -vvv: connection and module execution details.
    assert "ESTABLISH DOCKER CONNECTION" in stdout or "EXEC " in stdout, "the run was not verbose"
    scanned, hits = scan_tree(site["artifact_dir"], secrets)
    assert scanned >= len(site["events"]) >= 100, (scanned, len(site["events"]))
    assert hits == [], "secrets in the -vvv run's artifacts: %s" % hits


def s3_store_refusal(line, secrets):
    """True for SeaweedFS's journal line about a refused access key and nothing else.

    The lab's S3 store logs the access key ID of a request it refuses ("InvalidAccessKeyId:
    attempted key '<id>' not found"), as S3 services record access key IDs of failed calls.
    test_validation_faults.py provokes it on purpose (the key revoked), so the journal has it
    when that test ran before this one. The ID is allowed there and only there: the line must
    be exactly that message, with no other secret (the secret key, the API key) in it.
    """
    quoted = "attempted key '%s' not found" % secrets["S3 access key"]
    return ("InvalidAccessKeyId: " + quoted) in line and found_in(line, secrets) == ["S3 access key"]


def test_s3_store_refusal_allowance_is_narrow():
    fake = Secrets()
    fake.update({"api key": "A" * 20, "S3 access key": "K" * 20, "S3 secret key": "S" * 40})
    line = "    MESSAGE=W1130 18:39:09.111159 auth_signature_v4.go:256 InvalidAccessKeyId: attempted key '%s' not found."
    assert s3_store_refusal(line % fake["S3 access key"], fake)
    # the secret key or the API key in the same message, or the access key elsewhere, stay findings
    assert not s3_store_refusal(line % fake["S3 access key"] + " secret=" + fake["S3 secret key"], fake)
    assert not s3_store_refusal(line % fake["S3 secret key"], fake)
    assert not s3_store_refusal(line % fake["api key"], fake)
    assert not s3_store_refusal("    _CMDLINE=weed -s3.key=%s" % fake["S3 access key"], fake)


@pytest.mark.parametrize("what", ["units", "files", "journal"])
def test_no_secret_on_any_lab_host(secrets, lab_containers, inventory, what):
    s3_hosts = group_hosts(inventory, "kvcache_s3_store")
    problems = []
    for host, container in sorted(lab_containers.items()):
        scanned, hits = docker_scan(container, what, list(secrets.values()))
        assert scanned > 0, "%s: nothing scanned for %s" % (host, what)
        if what == "journal" and host in s3_hosts:
            hits = [line for line in hits if not s3_store_refusal(line, secrets)]
        problems.extend("%s: %s" % (host, masked(line, secrets)) for line in hits)
    assert problems == [], "secrets found (%s):\n%s" % (what, "\n".join(problems))


def test_systemctl_show_of_kvcache_units_has_no_secret(secrets, lab_containers):
    problems = []
    shown = {}
    for host, container in sorted(lab_containers.items()):
        names = set()
        # kvcache's own units; on the monitoring host, the Prometheus the observability role runs
        # (list-unit-files exits 1 when no file matches a pattern: the other host kind's).
        for argv in (["systemctl", "list-units", "--all", "--plain", "--no-legend", "kvcache*", "prometheus*"],
                     ["systemctl", "list-unit-files", "--no-legend", "kvcache*", "prometheus*"]):
            out = docker_exec(container, *argv, timeout=60, check=False).stdout
            names.update(line.split()[0] for line in out.splitlines() if line.strip())
        # A template (kvcache-vllm@.service) cannot be shown; its instances are listed by list-units.
        names = sorted(n for n in names if not n.endswith("@.service"))
        assert names, "%s: no kvcache* or prometheus* unit" % host
        shown[host] = names
        out = docker_exec(container, "systemctl", "show", *names, timeout=60).stdout
        assert out.count("Id=") >= len(names)
        for label in found_in(out, secrets):
            problems.append("%s: %s in `systemctl show`" % (host, label))
    assert problems == [], problems
    assert any(n.startswith("kvcache-vllm@") for names in shown.values() for n in names), shown

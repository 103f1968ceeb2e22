"""Integration tests: the real storage roles (and the real netapp.ontap modules), run by
ansible-playbook against strict test doubles of the management APIs on 127.0.0.1.

Run from the repository root: `python -m pytest tests/integration -q` (with build/venv's
python, which has ansible, requests and boto3).
"""
import os
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build")
COLLECTIONS = os.path.join(BUILD, "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "kvcache", "offload")
# One playbook + inventory per storage role, run by the tests here (not ansible-test targets).
PLAYBOOKS = os.path.join(ROOT, "tests", "integration", "storage_playbooks")

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if not os.path.lexists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.join("..", "..", "..", ".."), LINK)


def ansible_env(tmp_path, **extra):
    """The environment the integration tests run ansible-playbook in: this checkout's
    ansible.cfg and collections, a private local temp under tmp_path, no colour; extra on top."""
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        "ANSIBLE_HOME": os.path.join(BUILD, "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_COLLECTIONS_PATH": COLLECTIONS,
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    })
    env.update(extra)
    return env


def _ansible_playbook():
    here = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    return here if os.path.exists(here) else shutil.which("ansible-playbook")


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("double-tls"))


@pytest.fixture(scope="session")
def lab_tls_stand_in(tmp_path_factory):
    """A throw-away certificate and key where the lab inventory looks for the router's and the nodes' (kvcache_lab_tls_dir).

    The lab's own are made by playbooks/lab_up.yml, which may be running beside this suite in
    make test (or not have run at all on a clean clone); this suite must not depend on it or touch it.
    """
    import datetime
    import ipaddress
    import re

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    path = tmp_path_factory.mktemp("lab-tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "preflight test (throw-away)")])
    now = datetime.datetime.now(datetime.timezone.utc)
    # every lab host's address: the nodes' engine certificates must name theirs (the vllm checks)
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml"), encoding="utf-8") as handle:
        addresses = sorted(set(re.findall(r"ansible_host: (\d+\.\d+\.\d+\.\d+)", handle.read())) | {"127.0.0.1"})
    sans = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).add_extension(sans, critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (path / "ca.crt").write_bytes(pem)
    # the router's, and each lab node's engine certificate (the lab runs with kvcache_engine_tls)
    for name in ("router", "lab-node1", "lab-node2"):
        (path / (name + ".crt")).write_bytes(pem)
        (path / (name + ".key")).write_bytes(key_pem)
        (path / (name + ".key")).chmod(0o600)
    return str(path)


@pytest.fixture
def run_playbook(tmp_path):
    """Run tests/integration/storage_playbooks/<role>/playbook.yml with extra vars; return the completed process.

    inventory: another inventory file of that directory; playbook: a playbook path instead
    (e.g. playbooks/storage.yml); limit: ansible-playbook --limit.
    """

    def run(role, extra_vars, check=False, inventory="inventory.yml", playbook=None, limit=None):
        vars_file = tmp_path / ("vars-%s.yml" % role)
        data = dict(extra_vars)
        data.setdefault("ansible_python_interpreter", sys.executable)
        vars_file.write_text(yaml.safe_dump(data))
        env = ansible_env(tmp_path)
        cmd = [_ansible_playbook(), "-i", os.path.join(PLAYBOOKS, role, inventory),
               playbook or os.path.join(PLAYBOOKS, role, "playbook.yml"), "-e", "@%s" % vars_file]
        if check:
            cmd.append("--check")
        if limit:
            cmd += ["--limit", limit]
        return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)

    return run


def recap(stdout, host="controller"):
    """{'ok': n, 'changed': n, 'failed': n, ...} from the PLAY RECAP line of `host`."""
    for line in stdout.splitlines():
        if line.startswith(host + " ") and "ok=" in line:
            return {k: int(v) for k, v in (item.split("=") for item in line.split(":", 1)[1].split())}
    raise AssertionError("no PLAY RECAP for %s in:\n%s" % (host, stdout[-3000:]))


def fleet_default(name):
    """A fleet-wide default of roles/kvcache (what the nodes use unless the inventory says otherwise)."""
    with open(os.path.join(ROOT, "roles", "kvcache", "defaults", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)[name]


def flat(text):
    """Output with every run of whitespace made one space (the YAML callback wraps long messages)."""
    return " ".join(text.split())

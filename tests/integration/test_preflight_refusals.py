"""playbooks/preflight.yml on the lab inventory refuses each bad input before any stage runs (#18 item 4).

The lab inventory as shipped (inventories/lab), NOT the running lab: every host is redirected
to the local connection (`-e ansible_connection=local`), so preflight reads this machine as
each host, read-only, in check mode, and no lab container is contacted. Each case sets one
input a new user gets wrong and asserts that the preflight playbook itself fails on it, with
a message naming the variable to change and a fix, and that nothing reported a change.

The kernel cases make the nodes report another kernel release: the interpreter is a wrapper
whose sitecustomize makes platform.release() (where Ansible's setup module reads
ansible_facts.kernel) return KVCACHE_TEST_KERNEL.
"""
import json
import os
import secrets
import subprocess
import sys

import pytest

from conftest import ROOT, _ansible_playbook, ansible_env, flat

PLAYBOOK = os.path.join(ROOT, "playbooks", "preflight.yml")
INVENTORY = os.path.join(ROOT, "inventories", "lab")


@pytest.fixture
def preflight(tmp_path, lab_tls_stand_in):
    """Run the preflight playbook on the lab inventory (local connection, --check); return (rc, output, recaps)."""

    def run(extra_vars=None, kernel=""):
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import os, platform\n"
            "_k = os.environ.get('KVCACHE_TEST_KERNEL')\n"
            "if _k:\n"
            "    platform.release = lambda: _k\n")
        python = tmp_path / "python"
        python.write_text("#!/bin/sh\nPYTHONPATH=%s KVCACHE_TEST_KERNEL='%s' exec %s \"$@\"\n" % (site, kernel, sys.executable))
        python.chmod(0o755)
        data = {"ansible_connection": "local", "ansible_python_interpreter": str(python),
                "kvcache_lab_tls_dir": lab_tls_stand_in}
        data.update(extra_vars or {})
        vars_file = tmp_path / "vars.json"
        vars_file.write_text(json.dumps(data))
        env = ansible_env(tmp_path)
        proc = subprocess.run([_ansible_playbook(), "-i", INVENTORY, PLAYBOOK, "--check", "-e", "@%s" % vars_file],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        out = proc.stdout + proc.stderr
        recaps = {}
        for line in proc.stdout.splitlines():
            if "ok=" in line and "changed=" in line and ":" in line:
                host, counts = line.split(":", 1)
                recaps[host.strip()] = {k: int(v) for k, v in (i.split("=") for i in counts.split())}
        return proc.returncode, out, recaps

    return run


def assert_refused(result, *fragments):
    rc, out, recaps = result
    text = flat(out)
    assert rc != 0, "preflight passed:\n" + out[-3000:]
    assert recaps, out[-3000:]
    assert all(r["changed"] == 0 for r in recaps.values()), recaps
    assert sum(r["failed"] for r in recaps.values()) >= 1, recaps
    assert "Fix:" in text, out[-3000:]
    for fragment in fragments:
        assert fragment in text, "%r not in:\n%s" % (fragment, out[-3000:])
    return text


def test_the_lab_inventory_passes_preflight_as_shipped(preflight):
    rc, out, recaps = preflight()
    assert rc == 0, out[-3000:]
    assert set(recaps) == {"lab-monitor", "lab-node1", "lab-node2", "lab-router", "lab-s3", "localhost"}
    assert all(r["failed"] == 0 and r["changed"] == 0 for r in recaps.values()), recaps


def test_a_bad_router_setting_is_refused(preflight):
    text = assert_refused(preflight({"router_policy": "fastest"}), "router_policy is 'fastest'")
    assert "Host lab-router" in text


def test_an_s3_endpoint_without_scheme_is_refused(preflight):
    assert_refused(preflight({"kvcache_s3_endpoint": "s3.lab.internal:8333"}), "kvcache_s3_endpoint")


def test_a_bad_bucket_name_is_refused(preflight):
    assert_refused(preflight({"kvcache_s3_bucket": "KVCache_Lab"}), "kvcache_s3_bucket", "'KVCache_Lab'")


def test_a_string_where_lmcache_wants_a_boolean_is_refused(preflight):
    text = assert_refused(preflight({"lmcache_extra_config": {"save_unfull_chunk": "false"}}),
                          "lmcache_extra_config.save_unfull_chunk is 'false' (string)", "true or false, unquoted")
    assert "Host lab-node1" in text and "Host lab-node2" in text


def test_one_refused_node_stops_the_run_on_every_host(preflight):
    """The stages' checks run without any_errors_fatal (a play keyword is not templated): lab-node2's and the
    other hosts' checks go on after lab-node1 is refused (one run reports every refusal), and preflight's last
    play stops the run on every host. (When every host of a play is refused, Ansible ends the run there.)"""
    result = preflight({"lmcache_extra_config": "{{ {'save_unfull_chunk': 'false'} if inventory_hostname == 'lab-node1' else {} }}"})
    text = assert_refused(result, "Host lab-node1", "lmcache_extra_config.save_unfull_chunk is 'false' (string)")
    assert "Host lab-node2: " not in text, text[-3000:]
    assert "Host firewall of the router" in text, text[-3000:]  # the router stage's checks ran
    assert "Preflight refused lab-node1 (" in text, text[-3000:]
    rc, _out, recaps = result
    # the gate (run_once, any_errors_fatal) failed on the first host still running, which ends the run
    assert rc == 2 and recaps["lab-node1"]["failed"] == 1 and recaps["lab-node2"]["failed"] == 1, recaps


def test_a_public_hash_seed_is_refused_on_every_node(preflight):
    """Issue #33 item 2: the lab's examples used 123, which passed (the well-known value lets a tier
    writer compute object names and plant KV)."""
    text = assert_refused(preflight({"kvcache_hash_seed": 123}),
                          "kvcache_hash_seed is a well-known value (123", "keep it in vault as vault_kvcache_hash_seed")
    assert "Host lab-node1" in text and "Host lab-node2" in text


def test_seeds_that_differ_name_the_nodes_not_the_values(preflight):
    # seeds made here: every seed the repository writes is refused as well known
    one, two = secrets.randbelow(2**31), 2**31 + secrets.randbelow(2**31)
    text = assert_refused(preflight({"kvcache_hash_seed": "{{ %d if inventory_hostname == 'lab-node1' else %d }}" % (one, two)}),
                          "kvcache_hash_seed differs between the nodes that share the KV tier:", "(values not shown")
    # the nodes are named, in either order; the values never
    assert "lab-node1, lab-node2 (values" in text or "lab-node2, lab-node1 (values" in text, text[-3000:]
    assert str(one) not in text and str(two) not in text


NFS = {"kvcache_mount_type": "nfs", "kvcache_mount_server": "192.0.2.10", "kvcache_fs_path": "/mnt/kvcache-preflight-test"}


def test_a_kernel_without_trunkdiscovery_is_refused(preflight):
    text = assert_refused(preflight(NFS, kernel="5.15.0-91-generic"),
                          "kernel 5.15.0-91-generic does not know the NFS mount option trunkdiscovery",
                          "Linux 5.18 or later", "kvcache_mount_extra_options", 'kvcache_mount_extra_options: ["write=eager"]',
                          "upgrade its kernel")
    assert "Host lab-node1" in text


def test_the_fix_it_names_passes(preflight):
    rc, out, recaps = preflight(dict(NFS, kvcache_mount_extra_options=["write=eager"]), kernel="5.15.0-91-generic")
    assert rc == 0, out[-3000:]


def test_rhel_9_4_has_the_backport(preflight):
    # RHEL 9.0-9.1 (5.14.0 before -170.el9) are refused like 5.15 above: the filter's unit
    # tests cover the release table (tests/unit/plugins/filter/test_nfs_kernel.py); this run
    # proves an el9 kernel string from the facts reaches it whole.
    rc, out, recaps = preflight(NFS, kernel="5.14.0-427.13.1.el9_4.x86_64")
    assert rc == 0, out[-3000:]
    assert all(r["failed"] == 0 for r in recaps.values()), recaps


def test_an_lmcache_variable_in_the_engine_environment_lmcache_misreads_is_refused(preflight):
    assert_refused(preflight({"vllm_extra_env": {"LMCACHE_LOCAL_CPU": "yes"}}),
                   "vllm_extra_env.LMCACHE_LOCAL_CPU is 'yes'", "take it as false")


def test_async_loading_on_the_in_process_s3_tier_is_refused(preflight):
    # LMCache 0.5.6 pairs keys with the chunks its S3 connector could load, by position: a missing
    # object shifts the next chunk's KV into its place (docs/notes/lmcache-0.5.6-deleted-objects.md).
    # (in-process mode: the lab runs multiprocess mode, whose S3 L2 adapter is other code)
    text = assert_refused(preflight({"kvcache_tier": "s3", "kvcache_lmcache_mode": "inprocess",
                                     "lmcache_extra_config": {"enable_async_loading": True}}),
                          "async loading is on", "kvcache_tier s3", "Fix: remove enable_async_loading")
    assert "Host lab-node1" in text and "Host lab-node2" in text


# The storage management settings a production inventory adds (nothing is contacted: preflight runs
# the roles' checks only). The lab's nodes get one storage address each way (-e reaches every host).
ONTAP = {"ontap_nfs_hostname": "cluster.example.com", "ontap_nfs_username": "admin", "ontap_nfs_password": "secret",
         "ontap_nfs_svm": "svm_kv", "ontap_nfs_aggregate": "aggr1", "ontap_nfs_client_address": "10.30.0.21"}


@pytest.mark.parametrize("extra, says", [
    ({"ontap_nfs_client_cidrs": ["0.0.0.0/0"]}, "ontap_nfs_client_cidrs '0.0.0.0/0' lets in every IPv4 host"),
    ({"ontap_nfs_clients": ["10.0.0.0/8"]}, "ontap_nfs_clients item '10.0.0.0/8' is a subnet"),
], ids=["cidr-all", "subnet-as-client"])
def test_an_export_wider_than_the_nodes_is_refused(preflight, extra, says):
    """Issue #33: the ONTAP export names each node by its address; a subnet only in ontap_nfs_client_cidrs,
    and never 0.0.0.0/0. Failed on the code before it: preflight passed both (the rule took them as given)."""
    text = assert_refused(preflight(dict(ONTAP, **extra)), says, "ontap_nfs_client_cidrs")
    assert "Host localhost" in text


def test_engine_tls_without_a_certificate_or_key_is_refused(preflight):
    """Issue #32 item 3 (kvcache_engine_tls): a node without its certificate and key is refused before any
    change, naming the variables."""
    text = assert_refused(preflight({"vllm_tls_cert": "", "vllm_tls_key": "/nonexistent/engine.key"}),
                          "vllm_tls_cert is not set", "vllm_tls_key is '/nonexistent/engine.key', not a readable file")
    assert "Host lab-node1" in text and "Host lab-node2" in text


def test_an_engine_certificate_without_the_nodes_address_is_refused(preflight, tmp_path):
    """Every caller verifies the engine for the node's address: a certificate that does not name it would be
    refused by the router, validation and the role's own health check, so preflight refuses it first."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wrong node")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("10.9.9.9"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "wrong.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    text = assert_refused(preflight({"vllm_tls_cert": str(tmp_path / "wrong.crt")}),
                          "vllm_tls_cert does not name 172.29.100.11 (it names IP:10.9.9.9)",
                          "subject alternative names")
    assert "Host lab-node1" in text and "Host lab-node2" in text


def test_engine_tls_behind_the_production_stack_router_is_refused(preflight):
    """Its key gateway would forward to https engines without verifying them: refused, naming the fix."""
    text = assert_refused(preflight({"router_implementation": "production_stack"}),
                          "the production-stack router reaches the engines through the front's key gateway",
                          "router_implementation to vllm_router")
    assert "Host lab-router" in text


def test_a_tenant_api_over_http_is_refused(preflight):
    """Issue #33: the StorageGRID tenant password would cross the network in clear text. Failed on the code
    before it: preflight passed (and the role logged in over http)."""
    text = assert_refused(preflight({"storagegrid_s3_tenant_api_url": "http://admin.grid.example.com",
                                     "storagegrid_s3_tenant_account_id": "12345678901234567890",
                                     "storagegrid_s3_tenant_username": "root", "storagegrid_s3_tenant_password": "pw",
                                     "storagegrid_s3_key_user": "user/kvcache"}),
                          "storagegrid_s3_tenant_api_url is http://admin.grid.example.com",
                          "storagegrid_s3_tenant_allow_plain_http: true")
    assert "Host localhost" in text


@pytest.mark.parametrize("management_key, said", [
    ("", "storagegrid_s3_management_access_key / storagegrid_s3_management_secret_key"),
    ("{{ kvcache_s3_access_key }}", "storagegrid_s3_management_access_key is the nodes' key"),
], ids=["none", "the-nodes-key"])
def test_the_nodes_s3_key_as_the_buckets_management_key_is_refused(preflight, management_key, said):
    """Issue #33 item 4: without the tenant API, the key every node holds created the bucket and
    wrote its expiration rule. Failed on the code before it: preflight passed (one key did both)."""
    text = assert_refused(preflight({"kvcache_s3_management_access_key": management_key}),
                          said, "kvcache_s3_management_access_key", "storagegrid_s3_allow_shared_key: true")
    assert "Host localhost" in text


def test_an_alert_duration_prometheus_refuses_is_refused(preflight):
    """Issue #37 item 2: the alert rules' settings are checked on the monitoring hosts before any
    host changes (a rule file Prometheus refuses would stop its reload)."""
    text = assert_refused(preflight({"observability_alert_down_for": "2 minutes"}),
                          "observability_alert_down_for must be Prometheus durations above zero", "Fix:")
    assert "Host localhost" in text

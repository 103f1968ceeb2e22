"""Fault runs of playbooks/validate.yml against the running lab.

Each test breaks one thing for real, runs validate.yml (report into a temp dir), asserts
that the report fails the right stage with the right cause, and restores the lab in a
`finally` (also when the run or an assertion fails), waiting until every instance answers
/health again. Every step is bounded in time.

- shared tier unwritable for the engines' service user: the volume behind the nodes'
  /mnt/kvcache gets mode 0550 (LMCache's servers fail their stores softly and the engines
  serve on, so stage 2 fails: the tier does not grow) (a container cannot remount its volume read-only
  without privileges; chmod makes it unwritable for the service user, which is
  what a read-only export or a wrong export owner does to vLLM and LMCache);
- one instance with a different PYTHONHASHSEED: its env file (what systemd starts it with,
  and what the validation reads) is edited on the node and restored byte for byte (cp -p)
  afterwards; the instance is not restarted (the cause is read from the file: a restart
  would cost two engine starts on 2 cores and change nothing the cause analysis reads);
- S3 key revoked: the lab's engines use the fs tier, so the run is about the S3 path of the
  validation: every node gets an S3-tier LMCache config from the lmcache role
  (playbooks/s3_probe_config.yml), a control run must pass stage 6 through the lab's
  SeaweedFS bucket, then the key is revoked in the store's identities and the run must
  fail stage 6 and the tier listing with cause s3_auth (403); identities, store and node
  files are restored afterwards.

The runs use validation_prefix_tokens=640 as the lab inventory does (CPU prefill of the tiny
model in a few hundred milliseconds; two complete LMCache chunks of 256 tokens).
"""

import json

import pytest

from faultutil import (ENV_DIR, S3_PROBE_SERVER_ENV, S3_STORE_CONFIG, S3_STORE_UNIT, cause, lab_s3_keys,
                       run_validate, s3_probe_config, s3_vars, stage, wait_healthy, wait_s3)
from labutil import container_name, docker_exec, engine_url, group_hosts


@pytest.fixture(scope="module")
def instance_urls(hostvars, node_hosts):
    urls = []
    for host in node_hosts:
        for inst in hostvars[host]["vllm_instances"]:
            urls.append(engine_url(hostvars, host, inst["port"]))
    if not wait_healthy(urls, timeout=60):
        pytest.skip("the lab's instances do not answer /health (is the lab up?)")
    return urls


@pytest.fixture(scope="module")
def tier_kind(hostvars, node_hosts):
    return hostvars[node_hosts[0]].get("kvcache_tier", "fs")


def test_unwritable_tier_fails_stage_2_with_the_cause(tmp_path, hostvars, node_hosts, instance_urls, tier_kind):
    if tier_kind != "fs":
        pytest.skip("the lab's tier is not fs")
    # The tier is one volume in both nodes: a mode change on one node is seen by both.
    container = container_name(hostvars, node_hosts[0])
    path = hostvars[node_hosts[0]].get("kvcache_fs_path", "/mnt/kvcache")
    original = docker_exec(container, "stat", "-c", "%a", path).stdout.strip()
    try:
        docker_exec(container, "chmod", "0550", path)
        rc, report, out = run_validate(str(tmp_path))
    finally:
        docker_exec(container, "chmod", original, path, check=False)
        restored = wait_healthy(instance_urls)
    assert restored, "an instance did not come back after the fault run"
    assert docker_exec(container, "stat", "-c", "%a", path).stdout.strip() == original
    assert report is not None, out
    assert rc != 0, "the play must fail when a required stage fails"
    # With LMCache a failed write costs hits (stage 2 fails; a connector that crashes the
    # engine on a failed save fails stage 1 instead, engine_failed). Either way the failing
    # stage names the unwritable tier, and LMCache's own probe fails on it.
    failing = dict((s["id"], s) for s in report["stages"] if s["status"] == "fail")
    assert {"instances", "tier_write"} & set(failing), report["stages"]
    for sid in {"instances", "tier_write"} & set(failing):
        assert "tier_not_writable" in failing[sid]["causes"], failing[sid]
    assert sorted(cause(report, "tier_not_writable")["hosts"]) == ["lab-node1", "lab-node2"]
    assert "lmcache_probe" in failing and "tier_not_writable" in failing["lmcache_probe"]["causes"], report["stages"]
    assert set(report["failed_required"]) & {"instances", "tier_write"}
    assert "Validation failed" in out


def test_different_hash_seed_fails_stage_4_and_names_the_node(tmp_path, hostvars, node_hosts, instance_urls):
    host = node_hosts[-1]
    container = container_name(hostvars, host)
    inst = hostvars[host]["vllm_instances"][0]["name"]
    env_file = "%s/%s.env" % (ENV_DIR, inst)
    backup = "/root/.kvcache-validate-fault-%s.env" % inst
    unit = "kvcache-vllm@%s.service" % inst
    # the fleet's seed, a secret generated for the lab (build/lab/secrets/hash-seed), as the node has it
    env_text = docker_exec(container, "cat", env_file).stdout
    seed = [line.split("=", 1)[1] for line in env_text.splitlines() if line.startswith("PYTHONHASHSEED=")][0]
    odd = "999" if seed != "999" else "998"
    pid = docker_exec(container, "systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()
    docker_exec(container, "cp", "-p", env_file, backup)
    try:
        # The env file is what systemd starts the instance with, and what the validation reads
        # (the seed is a configuration cause). The instance is not restarted: the cause is
        # read from the file, and a restart costs two engine starts on 2 cores.
        docker_exec(container, "sed", "-i", "s/^PYTHONHASHSEED=.*/PYTHONHASHSEED=%s/" % odd, env_file)
        # stage 5 (the router) would fail the same way: not selected, to keep the run short
        rc, report, out = run_validate(str(tmp_path), extra=[
            "-e", '{"validation_stages": ["instances", "tier_write", "cross_instance", "lmcache_probe"]}'])
    finally:
        docker_exec(container, "cp", "-p", backup, env_file, check=False)
        docker_exec(container, "rm", "-f", backup, check=False)
    assert "PYTHONHASHSEED=%s\n" % seed in docker_exec(container, "cat", env_file).stdout
    assert docker_exec(container, "systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip() == pid
    assert report is not None, out
    assert rc != 0
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail", s4
    assert "hash_seed_mismatch" in s4["causes"], (s4, report["causes"])
    c = cause(report, "hash_seed_mismatch")
    assert c["hosts"] == [host], c
    # the seed is a fleet secret (issue #33): the report names who differs, never a value
    assert "%s/%s=another seed #1" % (host, inst) in c["message"], c
    assert seed not in json.dumps(report) and seed not in out
    assert report["failed_required"] == ["cross_instance"] or "cross_instance" in report["failed_required"]
    # the seed does not break the write or the LMCache probe
    assert stage(report, "tier_write")["status"] == "pass"
    assert stage(report, "lmcache_probe")["status"] == "pass"


def test_s3_key_revoked_fails_the_s3_stages_with_403(tmp_path, inventory, hostvars, instance_urls):
    """The node key is revoked in the S3 store: stage 6 and the tier listing fail with s3_auth.

    First a control run with the key in place must pass stage 6 through S3 (store on one
    node, load bit-exact on the other), so the failure after the revocation is the key's.
    """
    s3_host = group_hosts(inventory, "kvcache_s3_store")[0]
    container = container_name(hostvars, s3_host)
    keys = lab_s3_keys()
    assert wait_s3(hostvars, s3_host, keys, "ok") == "ok", "the lab's S3 store refuses the lab key before the test"
    backup = "/root/.kvcache-validate-fault-identities.json"
    s3_probe_config("present")
    try:
        rc, control, out = run_validate(str(tmp_path / "control"), extra=s3_vars(hostvars, s3_host))
        assert control is not None, out
        assert stage(control, "lmcache_probe")["status"] == "pass", (stage(control, "lmcache_probe"), out)
        assert rc == 0, out
        docker_exec(container, "cp", "-p", S3_STORE_CONFIG, backup)
        try:
            # Revoke: the identity keeps its name and rights, its credential is replaced.
            docker_exec(container, "python3", "-c", (
                "import json, secrets, sys; p = sys.argv[1]; d = json.load(open(p));"
                "[c.update(accessKey='REVOKED' + secrets.token_hex(8)) for i in d['identities'] for c in i['credentials']];"
                "json.dump(d, open(p, 'w'))"), S3_STORE_CONFIG)
            docker_exec(container, "systemctl", "restart", S3_STORE_UNIT, timeout=120)
            revoked = wait_s3(hostvars, s3_host, keys, "denied")
            assert revoked in ("InvalidAccessKeyId", "AccessDenied", "403"), revoked
            rc, report, out = run_validate(str(tmp_path / "revoked"), extra=s3_vars(hostvars, s3_host))
        finally:
            docker_exec(container, "cp", "-p", backup, S3_STORE_CONFIG, check=False)
            docker_exec(container, "rm", "-f", backup, check=False)
            docker_exec(container, "systemctl", "restart", S3_STORE_UNIT, timeout=120, check=False)
    finally:
        s3_probe_config("absent")
    assert wait_s3(hostvars, s3_host, keys, "ok") == "ok", "the S3 store did not accept the lab key again"
    for host in group_hosts(inventory, "kvcache_nodes"):
        left = docker_exec(container_name(hostvars, host), "ls", S3_PROBE_SERVER_ENV, check=False)
        assert left.returncode != 0, "the S3 probe config was not removed from %s" % host
    assert report is not None, out
    assert rc != 0, "the play must fail when the S3 key is refused"
    s6 = stage(report, "lmcache_probe")
    assert s6["status"] == "fail", s6
    assert "s3_auth" in s6["causes"], (s6, report["causes"])
    assert "lmcache_probe" in report["failed_required"]
    listing = stage(report, "tier_write")
    assert listing["status"] == "fail" and "s3_auth" in listing["causes"], listing
    assert "403" in cause(report, "s3_auth")["message"]
    # the engines (fs tier) are untouched by the S3 key
    assert stage(report, "instances")["status"] == "pass"
    # the stages left out by validation_stages ran no request and say why
    for stage_id in ("local_hit", "cross_instance", "router"):
        assert stage(report, stage_id)["status"] == "skipped", stage(report, stage_id)
        assert "not selected" in stage(report, stage_id)["reason"], stage(report, stage_id)

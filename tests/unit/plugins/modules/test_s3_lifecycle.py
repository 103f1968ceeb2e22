"""s3_lifecycle against a stubbed S3 client (botocore Stubber): idempotence, other rules kept,
check mode, read-back check. The real store is exercised in molecule/s3_store."""
import pytest

boto3 = pytest.importorskip("boto3")
from botocore.stub import Stubber  # noqa: E402

from ansible_collections.kvcache.offload.plugins.modules import s3_lifecycle  # noqa: E402

ARGS = {"bucket": "kvcache", "endpoint_url": "http://s3.lab.test:8333", "access_key": "AK", "secret_key": "SECRETKEY0",
        "expiration_days": 7}
MINE = {"ID": "kvcache-expiration", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 7}}
OTHER = {"ID": "someone-else", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}


CLIENT_KWARGS = []


@pytest.fixture
def s3(monkeypatch):
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="AK", aws_secret_access_key="SK",
                          endpoint_url="http://s3.lab.test:8333")
    stubber = Stubber(client)
    CLIENT_KWARGS.clear()

    def make_client(**kwargs):
        CLIENT_KWARGS.append(kwargs)
        return client

    monkeypatch.setattr(s3_lifecycle, "make_s3_client", make_client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


def test_the_client_is_the_collections_one_with_the_given_timeout_and_tls(run_module, s3):
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [MINE]}, {"Bucket": "kvcache"})
    result, failed = run_module(s3_lifecycle, dict(ARGS, timeout=7, ca_path="/etc/ssl/grid-ca.pem",
                                                   addressing_style="virtual"))
    assert not failed and result["changed"] is False
    assert CLIENT_KWARGS == [{
        "endpoint_url": "http://s3.lab.test:8333", "region": "us-east-1", "access_key": "AK",
        "secret_key": "SECRETKEY0", "session_token": None, "addressing_style": "virtual", "validate_certs": True,
        "ca_path": "/etc/ssl/grid-ca.pem", "connect_timeout": 7.0, "read_timeout": 7.0, "retries": 3}]


def no_config(stubber):
    stubber.add_client_error("get_bucket_lifecycle_configuration", service_error_code="NoSuchLifecycleConfiguration",
                             http_status_code=404, expected_params={"Bucket": "kvcache"})


def test_creates_the_rule_and_reads_it_back(run_module, s3):
    no_config(s3)
    s3.add_response("put_bucket_lifecycle_configuration", {},
                    {"Bucket": "kvcache", "LifecycleConfiguration": {"Rules": [MINE]}})
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [MINE]}, {"Bucket": "kvcache"})
    result, failed = run_module(s3_lifecycle, ARGS)
    assert not failed
    assert result["changed"] is True
    assert result["rules"] == [MINE]


def test_same_rule_changes_nothing_even_in_legacy_prefix_form(run_module, s3):
    legacy = {"ID": "kvcache-expiration", "Status": "Enabled", "Prefix": "", "Expiration": {"Days": 7}}
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [legacy]}, {"Bucket": "kvcache"})
    result, failed = run_module(s3_lifecycle, ARGS)
    assert not failed
    assert result["changed"] is False


def test_other_rules_are_kept_when_days_change(run_module, s3):
    old = dict(MINE, Expiration={"Days": 30})
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHER, old]}, {"Bucket": "kvcache"})
    s3.add_response("put_bucket_lifecycle_configuration", {},
                    {"Bucket": "kvcache", "LifecycleConfiguration": {"Rules": [OTHER, MINE]}})
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHER, MINE]}, {"Bucket": "kvcache"})
    result, failed = run_module(s3_lifecycle, ARGS)
    assert not failed and result["changed"] is True


def test_check_mode_writes_nothing(run_module, s3):
    no_config(s3)
    result, failed = run_module(s3_lifecycle, ARGS, check_mode=True)
    assert not failed and result["changed"] is True
    assert result["rules"] == [MINE]


def test_store_that_drops_the_rule_fails(run_module, s3):
    no_config(s3)
    s3.add_response("put_bucket_lifecycle_configuration", {},
                    {"Bucket": "kvcache", "LifecycleConfiguration": {"Rules": [MINE]}})
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": []}, {"Bucket": "kvcache"})
    result, failed = run_module(s3_lifecycle, ARGS)
    assert failed and "reads back" in result["msg"]


def test_absent_deletes_the_last_rule(run_module, s3):
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [MINE]}, {"Bucket": "kvcache"})
    s3.add_response("delete_bucket_lifecycle", {}, {"Bucket": "kvcache"})
    no_config(s3)
    result, failed = run_module(s3_lifecycle, dict(ARGS, state="absent"))
    assert not failed and result["changed"] is True and result["rules"] == []


def test_access_denied_is_reported(run_module, s3):
    s3.add_client_error("get_bucket_lifecycle_configuration", service_error_code="AccessDenied", http_status_code=403)
    result, failed = run_module(s3_lifecycle, ARGS)
    assert failed and "AccessDenied" in result["msg"]
    assert "SECRETKEY0" not in str(result)


@pytest.mark.parametrize("bad, text", [({"endpoint_url": "s3.lab.test:8333"}, "scheme"), ({"expiration_days": 0}, "at least 1")])
def test_bad_arguments(run_module, bad, text):
    result, failed = run_module(s3_lifecycle, dict(ARGS, **bad))
    assert failed and text in result["msg"]

"""Unit tests for the x509_check filter (kvcache.offload): a server certificate against its callers' names."""
import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.kvcache.offload.plugins.filter.x509_check import FilterModule, x509_check


def _pem(sans, days=(-1, 30), cn="node"):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now + datetime.timedelta(days=days[0]))
               .not_valid_after(now + datetime.timedelta(days=days[1])))
    if sans:
        entries = [x509.IPAddress(ipaddress.ip_address(v[3:])) if v.startswith("IP:") else x509.DNSName(v[4:]) for v in sans]
        builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_names_it_covers_and_lacks():
    pem = _pem(["IP:10.0.0.11", "IP:fd00::11", "DNS:gpu-a01.example.com", "DNS:*.nodes.example.com"])
    got = x509_check(pem, ["10.0.0.11", "[fd00::11]", "gpu-a01.example.com", "gpu-b02.nodes.example.com", ""])
    assert got["missing"] == [] and got["current"] and got["error"] is None, got
    got = x509_check(pem, ["10.0.0.12", "127.0.0.1", "a.b.nodes.example.com", "10.0.0.12"])
    assert got["missing"] == ["10.0.0.12", "127.0.0.1", "a.b.nodes.example.com"], got
    assert "IP:10.0.0.11" in got["names"] and "DNS:*.nodes.example.com" in got["names"]


def test_the_common_name_is_not_a_name_and_a_dns_name_is_not_an_address():
    assert x509_check(_pem([], cn="10.0.0.11"), ["10.0.0.11"])["missing"] == ["10.0.0.11"]
    assert x509_check(_pem(["DNS:10.0.0.11"]), ["10.0.0.11"])["missing"] == ["10.0.0.11"]


@pytest.mark.parametrize("days,current", [((-1, 30), True), ((-30, -1), False), ((1, 30), False)])
def test_validity(days, current):
    assert x509_check(_pem(["IP:10.0.0.11"], days=days), [])["current"] is current


def test_not_a_certificate():
    got = x509_check("-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n", ["10.0.0.11"])
    assert got["error"] and got["missing"] == []


def test_registered_as_filter():
    assert FilterModule().filters()["x509_check"] is x509_check

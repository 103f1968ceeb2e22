"""keytab_principals reads the principal names of a keytab from vault (base64), on the controller:
real MIT keytabs (tests/unit/fixtures/keytabs, written by ktutil), the older native-order version,
holes left by removed entries, and clear refusals of what is not a keytab."""
import base64
import os
import struct
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter.keytab_principals import FilterModule, keytab_principals

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "keytabs")


def b64(name):
    with open(os.path.join(FIXTURES, name), "rb") as handle:
        return base64.b64encode(handle.read()).decode()


def entry(realm, parts, order=">", version=2):
    """One keytab entry as MIT's format lays it out (the key is zeros: the filter never reads it)."""
    def counted(text):
        raw = text.encode()
        return struct.pack(order + "H", len(raw)) + raw
    count = len(parts) + (1 if version == 1 else 0)
    body = struct.pack(order + "H", count) + counted(realm) + b"".join(counted(p) for p in parts)
    if version == 2:
        body += struct.pack(order + "I", 1)  # name type
    body += struct.pack(order + "IB", 0, 1) + struct.pack(order + "H", 18) + struct.pack(order + "H", 32) + bytes(32)
    return struct.pack(order + "i", len(body)) + body


def test_registered():
    assert FilterModule().filters()["keytab_principals"] is keytab_principals


def test_real_mit_keytabs():
    assert keytab_principals(b64("host.keytab")) == ["host/gpu-a.example.com@EXAMPLE.COM",
                                                     "nfs/gpu-a.example.com@EXAMPLE.COM"]
    assert keytab_principals(b64("client.keytab")) == ["kvcache@EXAMPLE.COM"]


def test_holes_are_skipped_and_the_old_native_order_is_read():
    hole = struct.pack(">i", -12) + bytes(12)
    data = b"\x05\x02" + entry("EXAMPLE.COM", ["a"]) + hole + entry("EXAMPLE.COM", ["b", "c"])
    assert keytab_principals(base64.b64encode(data)) == ["a@EXAMPLE.COM", "b/c@EXAMPLE.COM"]
    native = "<" if sys.byteorder == "little" else ">"
    old = b"\x05\x01" + entry("EXAMPLE.COM", ["host", "n1"], order=native, version=1)
    assert keytab_principals(base64.b64encode(old).decode()) == ["host/n1@EXAMPLE.COM"]


@pytest.mark.parametrize("value, says", [
    ("", "expected a keytab as base64"),
    ("not base64 at all!", "not base64"),
    (base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(), "does not start with a keytab version"),
    (base64.b64encode(b"\x05\x02").decode(), "holds no key"),
    (base64.b64encode(b"\x05\x02" + struct.pack(">i", 400) + bytes(20)).decode(), "runs past the end"),
], ids=["empty", "not-base64", "pem", "no-entry", "truncated"])
def test_what_is_not_a_keytab_is_refused_with_the_fix(value, says):
    with pytest.raises(AnsibleFilterError) as error:
        keytab_principals(value)
    assert says in str(error.value) and "Fix:" in str(error.value)

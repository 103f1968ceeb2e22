# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""x509_check: whether a server certificate names the addresses its callers use, and is current."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: x509_check
short_description: The names a server certificate lacks, and whether it is outside its validity
version_added: 0.1.0
description:
  - Reads the first certificate of a PEM text and checks it against the names its callers connect to,
    as a TLS client that verifies host names does (RFC 6125) - an IP address must be an IP address
    entry of the subject alternative names, a DNS name a DNS entry (a C(*.) wildcard covers one label).
    The subject's common name is not used (clients ignore it when the certificate has SANs).
  - Used by the vllm role's checks (and so preflight) for C(vllm_tls_cert) with C(kvcache_engine_tls),
    so a certificate that every caller would refuse fails before any host changes.
  - Needs the C(cryptography) Python library on the controller (ansible-core depends on it).
positional: names
options:
  _input:
    description: PEM text holding the certificate (first one used).
    type: str
    required: true
  names:
    description: The IP addresses and DNS names the certificate must name. Empty items are ignored.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: The engine certificate names the node's address
  ansible.builtin.assert:
    that: (lookup('ansible.builtin.file', vllm_tls_cert) | kvcache.offload.x509_check([ansible_host])).missing | length == 0
"""

RETURN = r"""
_value:
  description: What the check found.
  type: dict
  contains:
    missing:
      description: The names the certificate does not cover.
      type: list
      elements: str
    names:
      description: The certificate's subject alternative names (C(IP:...), C(DNS:...)).
      type: list
      elements: str
    not_after:
      description: End of its validity, ISO 8601 UTC.
      type: str
    current:
      description: Whether now is inside its validity.
      type: bool
    error:
      description: Why the text could not be read as a certificate (the other keys are then empty).
      type: str
"""

import datetime
import ipaddress

try:
    from cryptography import x509
    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover
    HAS_CRYPTOGRAPHY = False


def _covers_dns(pattern, name):
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern.startswith("*."):
        head, _dot, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


def x509_check(pem, names):
    """{missing, names, not_after, current, error} of the first certificate in pem against names."""
    out = {"missing": [], "names": [], "not_after": "", "current": False, "error": None}
    if not HAS_CRYPTOGRAPHY:
        out["error"] = "the cryptography library is missing on the controller"
        return out
    try:
        cert = x509.load_pem_x509_certificate(str(pem).encode())
    except (ValueError, TypeError) as exc:
        out["error"] = "not a PEM certificate (%s)" % exc
        return out
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        dns = list(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        ips, dns = [], []
    out["names"] = ["IP:%s" % ip for ip in ips] + ["DNS:%s" % d for d in dns]
    for name in names or []:
        name = str(name or "").strip().strip("[]")
        if not name:
            continue
        try:
            address = ipaddress.ip_address(name)
            ok = any(ipaddress.ip_address(ip) == address for ip in ips)
        except ValueError:
            ok = any(_covers_dns(d, name) for d in dns)
        if not ok and name not in out["missing"]:
            out["missing"].append(name)
    not_before = getattr(cert, "not_valid_before_utc", None) or cert.not_valid_before.replace(tzinfo=datetime.timezone.utc)
    not_after = getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    now = datetime.datetime.now(datetime.timezone.utc)
    out["not_after"] = not_after.strftime("%Y-%m-%dT%H:%M:%SZ")
    out["current"] = not_before <= now <= not_after
    return out


class FilterModule(object):
    """kvcache.offload x509 filters."""

    def filters(self):
        return {"x509_check": x509_check}

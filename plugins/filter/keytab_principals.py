# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""keytab_principals: the principal names in a Kerberos keytab given as base64."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: keytab_principals
short_description: The principal names in a Kerberos keytab (base64), without its keys
version_added: 0.1.0
description:
  - Reads the keytab file format MIT Kerberos writes (and Heimdal, Active Directory's ktpass, FreeIPA's
    ipa-getkeytab; version 0x0502, or 0x0501 in the host's byte order) and returns the principal of every
    entry, C(primary/instance@REALM), in file order without repeats. Keys, timestamps and key versions are
    skipped, never returned.
  - Lets kvcache_mount check a keytab from vault on the controller, before any change on a node and in
    preflight (a node key in the fleet's realm, the service user's own principal).
  - Fails with a clear message on anything that is not base64 or not a keytab.
positional: _input
options:
  _input:
    description: The keytab's bytes as base64 (C(base64 -w0 file.keytab)), the way vault holds it.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Fail unless the service user's keytab holds its own key
  ansible.builtin.assert:
    that: ('kvcache@EXAMPLE.COM') in (kvcache_mount_krb5_client_keytab | kvcache.offload.keytab_principals)
"""

RETURN = r"""
_value:
  description: Principal names, e.g. C(["host/gpu-a.example.com@EXAMPLE.COM"]).
  type: list
  elements: str
"""

import base64
import binascii
import struct
import sys

from ansible.errors import AnsibleFilterError


def _counted(data, offset, order):
    """A counted octet string (16-bit length, then the bytes) and the offset after it."""
    (length,) = struct.unpack_from(order + "H", data, offset)
    start = offset + 2
    if start + length > len(data):
        raise ValueError("a name runs past the end of its entry")
    return data[start:start + length].decode("utf-8", "replace"), start + length


def principals(data):
    """Principal names of a keytab's entries (bytes in, list out); ValueError when it is not one."""
    if len(data) < 2 or data[0] != 5 or data[1] not in (1, 2):
        raise ValueError("it does not start with a keytab version (0x0501 or 0x0502)")
    version = data[1]
    order = ">" if version == 2 else ("<" if sys.byteorder == "little" else ">")
    names, offset = [], 2
    while offset + 4 <= len(data):
        (size,) = struct.unpack_from(order + "i", data, offset)
        offset += 4
        if size == 0:
            break
        if size < 0:  # a hole left by a removed entry
            offset += -size
            continue
        entry = data[offset:offset + size]
        if len(entry) < size:
            raise ValueError("an entry of %d bytes runs past the end of the file" % size)
        try:
            (count,) = struct.unpack_from(order + "H", entry, 0)
            if version == 1:
                count -= 1  # version 1 counts the realm as a component
            realm, pos = _counted(entry, 2, order)
            parts = []
            for _i in range(count):
                part, pos = _counted(entry, pos, order)
                parts.append(part)
        except struct.error:
            raise ValueError("an entry is cut short")
        name = "/".join(parts) + "@" + realm
        if name not in names:
            names.append(name)
        offset += size
    if not names:
        raise ValueError("it holds no key")
    return names


def keytab_principals(value):
    """Principal names of the keytab given as base64."""
    if not isinstance(value, (str, bytes)) or not value:
        raise AnsibleFilterError("keytab_principals: expected a keytab as base64 text, got %s. "
                                 "Fix: base64 -w0 file.keytab, into vault." % type(value).__name__)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AnsibleFilterError("keytab_principals: the value is not base64. Fix: base64 -w0 file.keytab, into vault.")
    try:
        return principals(bytearray(data))
    except ValueError as error:
        raise AnsibleFilterError("keytab_principals: not a Kerberos keytab: %s. Fix: export it with ktutil or "
                                 "ipa-getkeytab, then base64 -w0 file.keytab." % error)


class FilterModule(object):
    """kvcache.offload Kerberos filters."""

    def filters(self):
        return {"keytab_principals": keytab_principals}

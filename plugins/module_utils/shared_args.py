# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options several modules share, each defined once (the modules' connection contract).

A module merges these into its argument_spec instead of writing the options out itself,
the way netapp.ontap's ``na_ontap_host_argument_spec()`` and community.docker's
``DOCKER_COMMON_ARGS`` do. Every function returns a fresh dict (AnsibleModule changes
the spec it is given). The documentation of each set is a doc fragment with the same
options, kept equal to the spec by tests/unit/plugins/test_connection_contract.py:

=========================  ===========================================================
``http_argument_spec()``   ``kvcache.offload.http_client``: api_key, headers, timeout,
                           validate_certs, ca_path (module_defaults group ``http``)
``s3_argument_spec()``     ``kvcache.offload.s3_client``: endpoint_url, region,
                           access_key, secret_key, session_token, validate_certs,
                           ca_path, timeout (module_defaults group ``s3``)
``addressing_style_spec``  S3 modules that name the bucket through boto3 (not part of the
                           ``s3`` group: s3_vhost_probe always uses the bucket's host name)
``timeout_spec()``         every other module with a time limit
=========================  ===========================================================

Timeouts are float seconds everywhere. Spellings used before this contract
(``endpoint``, ``ca_bundle``) stay accepted as aliases with a deprecation warning until
DEPRECATED_ALIAS_VERSION.
"""

from __future__ import annotations

COLLECTION_NAME = "kvcache.offload"
# Old option spellings are removed in this release (they work, with a warning, before it).
DEPRECATED_ALIAS_VERSION = "0.2.0"

# Default seconds for one connection or answer; modules that wait longer pass their own.
DEFAULT_TIMEOUT = 10.0


def _option(type_, old_names=(), **kwargs):
    """One option; old_names become aliases with a deprecation."""
    spec = dict(type=type_, **kwargs)
    if old_names:
        spec["aliases"] = list(old_names)
        spec["deprecated_aliases"] = [
            dict(name=name, version=DEPRECATED_ALIAS_VERSION, collection_name=COLLECTION_NAME) for name in old_names
        ]
    return spec


def timeout_spec(default=DEFAULT_TIMEOUT):
    """``timeout``: float seconds, positive (the module checks; a float spec cannot)."""
    return {"timeout": _option("float", default=float(default))}


def _tls_spec(old_ca_names=()):
    return {
        "validate_certs": _option("bool", default=True),
        "ca_path": _option("path", old_ca_names),
    }


def http_argument_spec(timeout=DEFAULT_TIMEOUT):
    """Options of the modules that talk HTTP(S) to vLLM, LMCache or the router."""
    spec = {
        "api_key": _option("str", no_log=True),
        "headers": _option("dict", default={}),
    }
    spec.update(timeout_spec(timeout))
    spec.update(_tls_spec())
    return spec


def s3_argument_spec(timeout=DEFAULT_TIMEOUT, required=False):
    """Options of the modules that talk to an S3 store.

    required=True makes endpoint_url, access_key and secret_key required (module_defaults
    of the ``s3`` group can still supply them).
    """
    spec = {
        "endpoint_url": _option("str", ("endpoint",), required=required),
        "region": _option("str", default="us-east-1"),
        "access_key": _option("str", required=required, no_log=True),
        "secret_key": _option("str", required=required, no_log=True),
        "session_token": _option("str", no_log=True),
    }
    spec.update(timeout_spec(timeout))
    spec.update(_tls_spec(old_ca_names=("ca_bundle",)))
    return spec


def addressing_style_spec(default="auto"):
    """``addressing_style``: how boto3 names the bucket (path, virtual or auto)."""
    return {"addressing_style": _option("str", choices=["auto", "path", "virtual"], default=default)}


def shared_specs():
    """Every shared set, by name, with its defaults (for tests and documentation)."""
    return {
        "http": http_argument_spec(),
        "s3": s3_argument_spec(),
        "addressing_style": addressing_style_spec(),
        "timeout": timeout_spec(),
    }


def shared_option_names():
    """Every shared option name and every alias of one: what no module may define itself."""
    names = set()
    for spec in shared_specs().values():
        for name, option in spec.items():
            names.add(name)
            names.update(option.get("aliases", ()))
    return names

# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment for the HTTP options the collection's HTTP modules share."""

from __future__ import annotations


class ModuleDocFragment:  # pylint: disable=too-few-public-methods
    """The options of module_utils/shared_args.py http_argument_spec(), documented once."""

    DOCUMENTATION = r"""
options:
  api_key:
    description:
      - 'API key, sent as C(Authorization: Bearer <key>). Omit to send no Authorization header.'
      - Never logged and never returned.
    type: str
  headers:
    description:
      - Extra request headers, for example the session header of the router's session routing.
      - Do not put secrets here; use O(api_key).
    type: dict
    default: {}
  timeout:
    description:
      - Seconds to connect and for every read (float).
    type: float
    default: 10.0
  validate_certs:
    description:
      - Verify the server's TLS certificate (https only). Keep it on outside a lab.
    type: bool
    default: true
  ca_path:
    description:
      - PEM file of CA certificates to verify the server with, instead of the system trust store.
      - Ignored when O(validate_certs=false).
    type: path
notes:
  - The options above are the same in every module of the C(kvcache.offload.http) action group; set them once
    for all of them with C(module_defaults) and C(group/kvcache.offload.http).
"""

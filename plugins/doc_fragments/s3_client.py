# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment for the S3 connection options the collection's S3 modules share."""

from __future__ import annotations


class ModuleDocFragment:  # pylint: disable=too-few-public-methods
    """region, validate_certs and ca_bundle: the same meaning and default in every S3 module."""

    DOCUMENTATION = r"""
options:
  region:
    description:
      - Region for the SigV4 signature. StorageGRID accepts any region; LMCache needs one.
    type: str
    default: us-east-1
  validate_certs:
    description:
      - Verify the S3 endpoint's TLS certificate (https only). Keep it on outside a lab.
    type: bool
    default: true
  ca_bundle:
    description:
      - PEM file of CA certificates to verify the S3 endpoint with, instead of the system trust store.
      - Ignored when O(validate_certs=false).
    type: path
"""

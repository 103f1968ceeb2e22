# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment for the S3 connection options the collection's S3 modules share."""

from __future__ import annotations


class ModuleDocFragment:  # pylint: disable=too-few-public-methods
    """The options of module_utils/shared_args.py s3_argument_spec(), documented once."""

    DOCUMENTATION = r"""
options:
  endpoint_url:
    description:
      - S3 endpoint URL with scheme, for example V(https://s3.grid.example.com:10443) or V(http://s3.lab.internal:8333).
      - The alias O(endpoint) is deprecated and will be removed in version 0.2.0.
    type: str
    aliases: [endpoint]
  region:
    description:
      - Region for the SigV4 signature. StorageGRID accepts any region; LMCache needs one.
    type: str
    default: us-east-1
  access_key:
    description:
      - S3 access key ID.
    type: str
  secret_key:
    description:
      - S3 secret access key.
    type: str
  session_token:
    description:
      - S3 session token, for temporary credentials.
    type: str
  timeout:
    description:
      - Seconds to connect and for every answer (float).
    type: float
    default: 10.0
  validate_certs:
    description:
      - Verify the S3 endpoint's TLS certificate (https only). Keep it on outside a lab.
    type: bool
    default: true
  ca_path:
    description:
      - PEM file of CA certificates to verify the S3 endpoint with, instead of the system trust store.
      - Ignored when O(validate_certs=false).
      - The alias O(ca_bundle) is deprecated and will be removed in version 0.2.0.
    type: path
    aliases: [ca_bundle]
notes:
  - The connection options O(endpoint_url), O(region), O(access_key), O(secret_key), O(session_token), O(timeout),
    O(validate_certs) and O(ca_path) are the same in every module of the C(kvcache.offload.s3) action group; set
    them once for all of them with C(module_defaults) and C(group/kvcache.offload.s3). Set C(addressing_style)
    per task, not for the group (M(kvcache.offload.s3_vhost_probe) has no such option).
"""

    # kvcache.offload.s3_client.addressing_style: module_utils/shared_args.py addressing_style_spec(),
    # for the S3 modules that name the bucket through boto3. Not part of the s3 action group's
    # options (s3_vhost_probe always uses the bucket's host name).
    ADDRESSING_STYLE = r"""
options:
  addressing_style:
    description:
      - How the client names the bucket. V(path) (C(https://endpoint/bucket)) works before the endpoint
        domain's DNS exists; V(virtual) (C(https://bucket.endpoint)) is the only style LMCache itself uses;
        V(auto) lets boto3 choose.
    type: str
    choices: [auto, path, virtual]
    default: auto
"""

# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only module of the GPU contract: returns the facts of a GPU-shaped node.

The roles read a few host facts (RAM for LMCache's CPU tier); the contract renders them
for a fixed GPU server shape instead of the controller's, so the rendered files do not
depend on the machine the contract runs on.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_contract_node_facts
short_description: Set the host facts of a GPU-shaped node (GPU contract tests only)
description:
  - Returns O(facts) as C(ansible_facts), nothing else. Changes nothing.
options:
  facts:
    description: The facts to set.
    type: dict
    required: true
author:
  - kvcache.offload contributors (@kvcache-offload)
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts=module.params["facts"])


if __name__ == "__main__":
    main()

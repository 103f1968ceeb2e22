# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment for the collection's read-only modules (probes and checks)."""

from __future__ import annotations


class ModuleDocFragment:  # pylint: disable=too-few-public-methods
    """Attributes of a module that only reads: full check mode, no diff."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Changes nothing on the target; supported in check mode (see the notes for what a module skips there).
    support: full
  diff_mode:
    description: No diff is returned.
    support: none
"""

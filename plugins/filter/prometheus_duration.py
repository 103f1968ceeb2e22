# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""prometheus_duration: seconds of a Prometheus duration string, or None when Prometheus would refuse it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: prometheus_duration
short_description: The seconds of a Prometheus duration (C(15s), C(1m30s), C(500ms)), or none when Prometheus refuses it
version_added: 0.1.0
description:
  - Parses a duration as Prometheus's configuration does (C(model.ParseDuration)) - units C(y), C(w), C(d), C(h), C(m),
    C(s), C(ms), each at most once and in that order, integers only - and returns its length in seconds.
  - Returns none for a string Prometheus refuses (C(15), C(1.5m), C(s15), C(1m1h), an empty string); C(0) is the one
    unitless value it accepts and gives C(0).
options:
  _input:
    description: The duration, e.g. C(15s).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Refuse a scrape timeout longer than the interval
  ansible.builtin.assert:
    that: (observability_scrape_timeout | kvcache.offload.prometheus_duration)
          <= (observability_scrape_interval | kvcache.offload.prometheus_duration)
"""

RETURN = r"""
_value:
  description: The duration in seconds (a float), or none when Prometheus would refuse the string.
  type: float
"""

import re

# prometheus/common model.ParseDuration (durationRE): each unit at most once, largest first.
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def prometheus_duration(value):
    text = str(value if value is not None else "").strip()
    if text == "0":
        return 0.0
    match = _DURATION.match(text)
    if not text or match is None:
        return None
    return float(sum(int(n) * unit for n, unit in zip(match.groups(), _UNITS) if n is not None))


class FilterModule(object):
    """kvcache.offload Prometheus filters."""

    def filters(self):
        return {"prometheus_duration": prometheus_duration}

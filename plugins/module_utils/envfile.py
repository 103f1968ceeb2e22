# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read systemd EnvironmentFile= text (KEY=VALUE lines) into a dict.

The subset systemd documents for environment files: blank lines and lines starting with
``#`` or ``;`` are ignored, an optional ``export`` is allowed, a value may be wrapped in
single or double quotes (inside double quotes ``\\"``, ``\\\\`` and ``\\$`` are unescaped),
and a trailing backslash continues a line.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _unquote(value):
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        inner = value[1:-1]
        return re.sub(r'\\(["\\$`])', r"\1", inner)
    return value


def parse_env_text(text):
    """Return {KEY: VALUE} of an environment file's text (later keys win, like systemd)."""
    env = {}
    pending = ""
    for raw in (text or "").splitlines():
        line = pending + raw
        pending = ""
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export "):].lstrip()
        if "=" not in stripped:
            continue
        key, value = stripped.split("=", 1)
        key = key.strip()
        if not _KEY.match(key):
            continue
        env[key] = _unquote(value)
    return env

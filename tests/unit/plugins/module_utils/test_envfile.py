"""systemd EnvironmentFile parsing."""
from __future__ import annotations

from ansible_collections.kvcache.offload.plugins.module_utils.envfile import parse_env_text


def test_quotes_comments_export_and_continuation():
    text = "\n".join([
        "# comment",
        "; also a comment",
        "",
        "A=plain",
        "B='single quoted with spaces'",
        'C="double \\"escaped\\" \\$HOME"',
        "export D=exported",
        "E=one \\",
        "two",
        "not a line",
        "1BAD=x",
        "A=later wins",
    ])
    env = parse_env_text(text)
    assert env == {"A": "later wins", "B": "single quoted with spaces", "C": 'double "escaped" $HOME',
                   "D": "exported", "E": "one two"}


def test_empty_and_none():
    assert parse_env_text("") == {}
    assert parse_env_text(None) == {}

"""The list of public hash seeds the checks refuse (roles/kvcache/vars/main.yml) is complete (issue #33 item 2).

"Any value in the repository's examples" is public: every seed this repository writes anywhere
(inventories, molecule, docs, roles, playbooks, scripts, tests, plugins) must be in the list, so
that an operator who copies one is refused. A new example or test seed fails here until listed.
"""
import os
import re

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
VARS = os.path.join(ROOT, "roles", "kvcache", "vars", "main.yml")
SCAN = ("inventories", "molecule", "docs", "roles", "playbooks", "scripts", "tests", "plugins", "README.md")
# kvcache_hash_seed: 123 / "kvcache_hash_seed": 123 / PYTHONHASHSEED=123 / "hash_seed": "123" / a test's Jinja choice
PATTERNS = (re.compile(r"""kvcache_hash_seed["']?\s*[:=]\s*["']?(\d+)"""),
            re.compile(r"PYTHONHASHSEED=(\d+)"),
            re.compile(r""""hash_seed":\s*"?(\d+)"""),
            re.compile(r"""kvcache_hash_seed["']?\s*[:=]\s*["']?\{\{\s*(\d+)\s+if .* else (\d+)"""))


SUFFIXES = (".yml", ".yaml", ".py", ".md", ".j2", ".env", ".sh", ".json", ".txt", ".example")


def repository_files(scan=SCAN, suffixes=SUFFIXES):
    """Every file with one of suffixes under the tops of the checkout in scan (a top may be a file)."""
    for top in scan:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            yield path
            continue
        for base, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", ".pytest_cache")]
            for name in files:
                if name.endswith(suffixes):
                    yield os.path.join(base, name)


def seeds_in_repository():
    found = {}
    for path in repository_files():
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                for pattern in PATTERNS:
                    for match in pattern.finditer(line):
                        for value in match.groups():
                            if value is not None:
                                found.setdefault(int(value), "%s:%d" % (os.path.relpath(path, ROOT), number))
    return found


def public_seeds():
    with open(VARS, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["__kvcache_public_hash_seeds"]


def test_every_seed_the_repository_writes_is_refused():
    public = public_seeds()
    found = seeds_in_repository()
    missing = {seed: where for seed, where in found.items() if seed not in public}
    assert not missing, "seeds used in the repository but not in __kvcache_public_hash_seeds: %s" % missing


def test_the_scan_sees_the_known_examples():
    # the scan can fail: it finds the production-stack chart's 123 (unit fixtures) and a unit test's 7
    found = seeds_in_repository()
    assert 123 in found and 7 in found, found
    assert 0 in public_seeds() and 123 in public_seeds()


def test_every_listed_seed_is_a_valid_pythonhashseed_with_a_reason():
    for seed, why in public_seeds().items():
        assert isinstance(seed, int) and 0 <= seed <= 4294967295, seed
        assert isinstance(why, str) and why, seed

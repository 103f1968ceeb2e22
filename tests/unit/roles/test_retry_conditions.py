# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A retried task's ``until`` must survive an attempt that failed without the field it reads.

The uri module fails without ``status`` when the server drops the connection while the body is
read (http.client.HTTPException: a unit restarting under load), and every module fails without its
fields on a MODULE FAILURE. ``until: result.status == 200`` then stops the play with "object of
type 'dict' has no attribute 'status'" instead of retrying: the router_container scenario's
idempotence run failed this way in CI (stop 27).
"""
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
TREES = ("roles", "playbooks", "molecule", "extensions", "examples")
# a registered variable's field read with a comparison, e.g. `__x.status == 200`
BARE_FIELD = re.compile(r"\b(__?\w+)\.(\w+)(?:\.\w+)*\s*(==|!=|>=|<=|>|<|\bin\b)")


def _tasks(node):
    if isinstance(node, dict):
        if "until" in node:
            yield node
        for value in node.values():
            yield from _tasks(value)
    elif isinstance(node, list):
        for item in node:
            yield from _tasks(item)


def _retried_tasks():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.yml")):
            if "/build/" in str(path):
                continue
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8"))
            except yaml.YAMLError:
                continue
            for task in _tasks(data):
                yield path.relative_to(ROOT), task


RETRIED = list(_retried_tasks())


def test_there_are_retried_tasks_to_check():
    assert len(RETRIED) >= 5


@pytest.mark.parametrize(
    "path,task", RETRIED, ids=[f"{p}:{t.get('name', '?')}" for p, t in RETRIED]
)
def test_until_reads_fields_with_a_default(path, task):
    condition = str(task["until"])
    bare = [
        match.group(0)
        for match in BARE_FIELD.finditer(condition)
        if not condition[match.end(2):].lstrip().startswith("|")
    ]
    assert not bare, (
        f"{path}: task {task.get('name')!r} retries on {bare}; a failed attempt may lack the field:"
        " read it with `| default(...)`"
    )

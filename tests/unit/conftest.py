"""Make the collection importable as ansible_collections.kvcache.offload in unit tests.

`make venv` links this checkout into build/collections; when run from a bare pytest
the same link is made here, so `python -m pytest tests/unit` works either way.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, "build", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "kvcache", "offload")

if not os.path.lexists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.join("..", "..", "..", ".."), LINK)
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

"""Put scripts/ on sys.path: bench.py and its section modules (bench_*.py) import each other by
name, as they do when `python scripts/bench.py` runs.
"""
import os
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                       "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

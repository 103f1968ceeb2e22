# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the deleted-object workers report (deleted_object_worker.py, deleted_object_mp_worker.py):
run the body, print one JSON line after MARK (the error and its trace when the body raised),
then exit at once with os._exit (LMCache 0.5.6's S3 clients never close cleanly)."""

import json
import os
import sys
import traceback

MARK = "KVCACHE_OFFLOAD_DELETED_OBJECT_RESULT "


def report(body):
    out = {"ok": False}
    try:
        body(out)
        out["ok"] = True
    except Exception as exc:  # noqa  (the test reads the error)
        out.update(error="%s: %s" % (type(exc).__name__, exc), trace=traceback.format_exc()[-3000:])
    sys.stdout.write(MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)

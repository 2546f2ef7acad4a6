"""An app that records, in each process that imports it, what that process had loaded
before the app's own imports: ``PROBE_DIR/<pid>.json`` with its command line, its
multiprocessing name and its modules then (tests/acceptance/test_claimer_start.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

_seen = {"argv": list(sys.orig_argv), "process": multiprocessing.current_process().name, "cwd": os.getcwd(),
         "safe_path": sys.flags.safe_path, "PYTHONSAFEPATH": os.environ.get("PYTHONSAFEPATH"),
         "modules": sorted(sys.modules)}
if os.environ.get("PROBE_DIR"):
    with open(os.path.join(os.environ["PROBE_DIR"], f"{os.getpid()}.json"), "w") as f:
        json.dump(_seen, f)

import pgworker  # noqa: E402 - after the record above, which is the point

app = pgworker.App()


@app.task(name="noop")
def noop(payload):
    return None


@app.task(name="nap")
def nap(payload):
    import time

    time.sleep(float(payload))  # a sync handler: it never looks at the pod stopping

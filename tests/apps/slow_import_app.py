"""An app whose module takes SLOW_IMPORT_SECONDS to import (a heavy application), so a
test can act while a claimer process is still starting."""

from __future__ import annotations

import os
import time

import pgworker

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "0")))

app = pgworker.App()


@app.task(name="noop")
def noop(payload):
    return None

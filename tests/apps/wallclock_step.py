"""Runs ``pgworker`` (``python wallclock_step.py run ...``) with this process's wall clock
stepped back an hour once the file named by ``WALLCLOCK_STEP_FLAG`` exists: an NTP step
or a VM resumed from a snapshot, without touching the machine's clock.

Only this process's ``time.time`` moves (the supervisor of ``pgworker run``); the
claimers are spawned interpreters with the real clock. The monotonic clock never moves
back, which is the point of the tests that use this.
"""

from __future__ import annotations

import os
import sys
import time

STEP_SECONDS = 3600.0
_FLAG = os.environ["WALLCLOCK_STEP_FLAG"]
_real_time = time.time


def _stepped_time() -> float:
    return _real_time() - (STEP_SECONDS if os.path.exists(_FLAG) else 0.0)


time.time = _stepped_time

if __name__ == "__main__":
    from pgworker.cli import main

    sys.exit(main(sys.argv[1:]))

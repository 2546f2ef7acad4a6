"""When a claimer process exits to be replaced (``max_jobs_per_child``,
``max_memory_per_child_bytes``)."""

from __future__ import annotations

import logging
import os

from ...config import Settings

log = logging.getLogger("pgworker.claimer")


def recycle_due(settings: Settings, index: int, jobs_done: int) -> bool:
    """Whether this claimer process should exit to be replaced (``max_jobs_per_child``
    jobs run, or resident memory above ``max_memory_per_child_bytes``)."""
    if settings.max_jobs_per_child and jobs_done >= settings.max_jobs_per_child:
        log.info("claimer %s ran %s jobs (max %s per child): recycling", index, jobs_done,
                 settings.max_jobs_per_child)
        return True
    if settings.max_memory_per_child_bytes and resident_bytes() > settings.max_memory_per_child_bytes:
        log.info("claimer %s uses %s bytes (max %s per child): recycling", index, resident_bytes(),
                 settings.max_memory_per_child_bytes)
        return True
    return False


def resident_bytes() -> int:
    """Resident set size of this process (Linux /proc/self/statm), 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0

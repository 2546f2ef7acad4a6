"""The entry point of a claimer process (multiprocessing, ``spawn``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ... import tracing
from ...config import Settings
from ..podlimits import PodQueueLimits
from ..shm.slots import SlotTable
from ..shm.wakeups import PodSignals

log = logging.getLogger("pgworker.claimer")


@dataclass(frozen=True)
class ClaimerSpec:
    """Everything a claimer process needs, picklable for ``spawn``: its index, every slot
    table of the pod (its own at ``index``), the pod's wake-up state and limits."""

    app_ref: str
    settings: Settings
    index: int
    tables: tuple[SlotTable, ...]
    queues: tuple[str, ...]
    drain: bool
    log_level: int | str
    log_format: str
    signals: PodSignals
    pod_limits: PodQueueLimits | None = None
    supervisor_pid: int = 0


def claimer_main(spec: ClaimerSpec) -> None:
    """Run one claimer until it is asked to stop (or is recycled)."""
    from ...loader import load_app
    from ...logs import setup_logging
    from .loop import Claimer

    setup_logging(spec.log_level, spec.log_format)
    # Each claimer sets up its own SDK (spawned processes share no exporter threads).
    provider = tracing.setup_process(spec.settings.tracing, trace_sql=spec.settings.trace_sql)
    app = load_app(spec.app_ref)
    app.configure(spec.settings)
    claimer = Claimer(app, spec.settings, spec.index, spec.tables[spec.index], spec.queues, drain=spec.drain,
                      peers=spec.tables, signals=spec.signals, pod_limits=spec.pod_limits,
                      supervisor_pid=spec.supervisor_pid)
    try:
        code = claimer.run()
    finally:
        tracing.flush(provider)
    if code:
        raise SystemExit(code)


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

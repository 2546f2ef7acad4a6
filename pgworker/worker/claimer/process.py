"""The entry point of a claimer process (multiprocessing: forked from the pod's fork
server, :mod:`pgworker.worker.forkserver`, or ``spawn``ed)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from ... import tracing
from ...config import Settings
from ..podlimits import PodQueueLimits
from ..shm.slots import SlotTable
from ..shm.wakeups import PodSignals
from .loop import Claimer

#: Set by ``manage.py pgworker`` (pgworker.contrib.django) for the processes it starts:
#: each claimer sets Django up before it loads the app, so that handlers can use the ORM.
DJANGO_WORKER_ENV = "PGWORKER_DJANGO_WORKER"

@dataclass(frozen=True)
class ClaimerSpec:
    """Everything a claimer process needs, picklable (forkserver and spawn): its index, every slot
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

    # The fork server ignores SIGTERM (pgworker.worker.forkserver); a claimer that is still
    # starting stops on it, as a spawned one did (Claimer.setup installs its own handler).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    setup_logging(spec.log_level, spec.log_format)
    # Each claimer sets up its own SDK (spawned processes share no exporter threads).
    provider = tracing.setup_process(spec.settings.tracing, trace_sql=spec.settings.trace_sql)
    around_job = None
    if os.environ.get(DJANGO_WORKER_ENV):  # started by `manage.py pgworker run`
        from ...contrib.django import setup_worker_process

        around_job = setup_worker_process()  # before the app's modules import models
    app = load_app(spec.app_ref)
    app.configure(spec.settings)
    claimer = Claimer(app, spec.settings, spec.index, spec.tables[spec.index], spec.queues, drain=spec.drain,
                      peers=spec.tables, signals=spec.signals, pod_limits=spec.pod_limits,
                      supervisor_pid=spec.supervisor_pid)
    claimer.executor.around_job = around_job
    try:
        code = claimer.run()
    finally:
        tracing.flush(provider)
    if code:
        raise SystemExit(code)

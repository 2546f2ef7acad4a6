"""The :class:`Supervisor`: its state, the run (start-up, services, claimers) and the
HTTP endpoints; the tick, settlement and shutdown are its halves in this package."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from ... import tracing
from ...config import Settings
from ...errors import DatabaseRefused, MissingGrants, PoolerError, SchemaVersionError
from ..forkserver import claimer_context
from ..drain import RunSummary, before_claiming, report as report_drain
from ..claimer import ClaimerSpec, claimer_main
from ..health import HealthState, serve_http
from ..lease import LeaseTerms
from ..metrics_setup import pod_metrics
from ..podlimits import PodQueueLimits
from ..service import worker_connect
from ..settler import Settler
from ..shm.wakeups import PodSignals
from ..startup import wait_for_database, warn_unknown_queues
from ..stats import StatsSource
from .pool import ClaimerHandle, ClaimerPool
from .retry_hold import RetryHold
from .services import lease_terms, start_services
from .settlement import Settlement
from .shutdown import EXIT_ERROR, EXIT_OK, STOP_SIGNALS, Shutdown, signal_exit_code
from .tick import Tick

log = logging.getLogger("pgworker.supervisor")

CLAIMER_STALL_SECONDS = 10.0  # /readyz fails when a claimer's outcome writes, or claims, fail for this long


class Supervisor(Tick, Settlement, Shutdown):
    """Runs one pod's worth of claimers. ``run()`` returns the process exit code."""

    def __init__(self, app: Any, app_ref: str, *, drain: bool = False, max_duration: float | None = None,
                 pushgateway_url: str | None = None, log_level: int | str = logging.INFO,
                 log_format: str = "text") -> None:
        self.app = app
        self.settings: Settings = app.settings
        self.app_ref = app_ref
        self.drain = drain
        self.max_duration = max_duration
        self.pushgateway_url = pushgateway_url
        self.log_level = log_level
        self.log_format = log_format
        self.store = app.store
        self.queues = app.queues()
        self.mp = claimer_context()  # claimers are forked from a server with their modules loaded
        self.stop_services = threading.Event()
        self.summary = RunSummary()
        self.phase = "starting"
        self.run_started = time.monotonic()  # the drain deadline counts from here
        self.received: list[int] = []
        self.stop_deadline = 0.0
        self.deadline_hit = False
        self.start_failure: str | None = None
        self.connect = worker_connect(self.settings)
        self.health = HealthState()
        self.metrics: Any = None
        self.http: Any = None
        self.services: list[Any] = []
        self.stats: StatsSource | None = None
        self.pool: ClaimerPool | None = None
        self.signals = PodSignals(self.mp)
        self.pod_limits: PodQueueLimits | None = None
        self.settler: Settler | None = None
        self.retry_hold = RetryHold(self.settings.poll_interval_seconds, drain=drain)
        self._task_names = sorted(app.tasks)  # a slot's task_index counts in this order

    # -- the run ------------------------------------------------------------------------

    def run(self) -> int:
        self.metrics = pod_metrics(self.app, self.queues, self.settings.metrics_task_label)
        self.health.listen_required = self.settings.listen and not self.drain
        provider = tracing.setup_process(self.settings.tracing, trace_sql=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        try:
            if not self.drain and self.settings.metrics_port:
                self._start_http()
            return self._run()
        finally:
            self.stop_services.set()
            for service in self.services:
                service.join(5)
            if self.http is not None:
                self.http.shutdown()
            if self.stats is not None:
                self.stats.close()
            if self.pod_limits is not None:
                self.pod_limits.close()
            if self.pool is not None:
                self.pool.close()
            self.signals.close()
            tracing.flush(provider)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if len(self.received) >= 2:
            # second signal: exit at once; leases expire and a reaper recovers the jobs
            if self.pool is not None:
                self.pool.kill_all()
            log.warning("second signal: exiting now without releasing jobs (leases will expire)")
            os._exit(signal_exit_code(signum))

    def _start_http(self) -> None:
        from ...database_gauges import QueueStatsCollector
        from ...loop_gauges import LoopGauges
        from ...metrics import exposition_registry

        extra: list[Any] = [LoopGauges(lambda: self.services, lambda: self.pool)]
        if self.settings.stats:
            self.stats = StatsSource(self.store, self.settings)
            extra.append(QueueStatsCollector(self.stats.fetch, lambda: self.queues, self.settings.stats_cache_seconds))
        self.http = serve_http(self.settings.metrics_host, self.settings.metrics_port,
                               exposition_registry(extra), self.health)
        log.info("serving /metrics, /healthz and /readyz on %s:%s", self.settings.metrics_host,
                 self.http.server_address[1])

    def _run(self) -> int:
        n = self.settings.concurrency
        log.info("pgworker %s: %s claimer%s on queues %s (schema %r)%s", _version(), n, "" if n == 1 else "s",
                 ", ".join(self.queues), self.settings.schema, ", drain mode" if self.drain else "")
        warn_unknown_queues(self.app)
        try:
            if not wait_for_database(self.settings, self.store, self.health, self.received, drain=self.drain,
                                     max_duration=self.max_duration):
                if self.drain:  # a signal while waiting is a stop (as while claiming), not a failure
                    self.summary.result = "interrupted" if self.received else "failed"
                    report_drain(self.summary, self.pushgateway_url, self.settings.schema)
                    return signal_exit_code(self.received[0]) if self.received else EXIT_ERROR
                return EXIT_OK
        except (SchemaVersionError, PoolerError, DatabaseRefused, MissingGrants) as exc:
            log.error("%s", exc)
            if self.drain:
                self.summary.result = "failed"
                report_drain(self.summary, self.pushgateway_url, self.settings.schema)
            return EXIT_ERROR
        if self.drain:
            self.summary.maintenance_failed = before_claiming(
                self.app, self.connect, self.metrics, schedules=self.schedules_on(), prune=self.settings.prune)
        limits = {q: c for q, c in self.settings.queue_concurrency if q in self.queues}
        if limits:
            self.pod_limits = PodQueueLimits(limits, n, self.mp)
        self.pool = ClaimerPool(mp=self.mp, count=n, capacity=self.settings.max_batch_size,
                                start_process=self._start_claimer)
        self.health.claimer_problem = lambda: self.pool.claimer_problem(CLAIMER_STALL_SECONDS)
        self.settler, self.services = start_services(self)
        self.pool.start()
        self.phase = "running"
        return self._supervise()

    # -- start-up -------------------------------------------------------------------------

    def schedules_on(self) -> bool:
        return bool(self.settings.schedules and getattr(self.app, "schedules", None))

    def _terms(self) -> LeaseTerms:
        return lease_terms(self.settings)

    def _start_claimer(self, h: ClaimerHandle) -> Any:
        spec = ClaimerSpec(self.app_ref, self.settings, h.index, tuple(self.pool.tables), tuple(self.queues),
                           self.drain, self.log_level, self.log_format, self.signals, self.pod_limits, os.getpid())
        process = self.mp.Process(target=claimer_main, args=(spec,), name=f"pgworker-claimer-{h.index}")
        process.start()
        return process

def _version() -> str:
    from ..._version import __version__

    return __version__

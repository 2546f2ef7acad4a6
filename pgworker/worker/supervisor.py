"""The supervisor: the parent process of ``pgworker run``.

It starts the pod's claimer processes and its services, then watches: every tick it
runs the lease clock (leases presumed lost without waiting on the database), stops
attempts past their hard limit, replaces claimers that exited and has what they held
settled, announces work on the fallback poll, and decides when to stop. Its services,
each a thread with its own connection: the renewer, the settler, the pod registry (read
by the console only), the listener, the reaper, the pruner and the scheduler (the last
four not in drain mode). /metrics,
/healthz and /readyz are served from here.

Shutdown (SIGTERM or SIGINT): stop claiming, release the jobs waiting unstarted (fenced,
no attempt spent), give running jobs ``shutdown_grace`` seconds (timeouts still hold),
then fail what still runs with ``SHUTDOWN`` (the attempt counts) and exit 0. A second
signal exits at once with 128 + the signal's number; leases then expire and a reaper
recovers the jobs.

Drain mode (``--drain``): maintenance once (:mod:`.drain`), then claim (woken by the
fallback poll; no LISTEN) until nothing is due and nothing is in flight, and exit 0; with ``max_duration`` and due work left at the
deadline, exit ``EXIT_DRAIN_DEADLINE``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from typing import Any

from .. import metrics_files, tracing
from ..config import Settings
from ..errors import PoolerError, SchemaVersionError
from ..schedules import Scheduler
from . import drain as drain_mode
from .claimer import ClaimerSpec, claimer_main
from .claimers import ClaimerHandle, ClaimerPool
from .health import HealthState, serve_http
from .lease import LeaseClock, LeaseTerms
from .listener import Listener
from .podlimits import PodQueueLimits
from .pruner import Pruner, Retention
from .reaper import Reaper, ReaperConfig
from .registry import registry_of
from .renewer import Renewer
from .scheduler import SchedulerService
from .service import worker_connect
from .startup import wait_for_database
from .settler import SHUTDOWN, Settler, hand_backs, settle, settlements
from .slots import SlotTableBusy, SlotView
from .stats import StatsSource
from .wakeups import PodSignals
from ..tasks import retry_delays

log = logging.getLogger("pgworker.supervisor")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_DRAIN_DEADLINE = 75  # EX_TEMPFAIL: the deadline passed with due work left; run again
SUPERVISE_TICK_SECONDS = 0.2
OUTCOME_WRITE_STALL_SECONDS = 10.0  # /readyz fails when a claimer's outcome writes fail for this long
# A job waiting unstarted in a claimer's batch this long (ten batch targets, see
# claimer/loop.py) is handed back to the table for any pod to run: its claimer is stuck
# behind a longer job than its batch sizing expected.
WAITING_HAND_BACK_SECONDS = 10.0


class Supervisor:
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
        self.mp = multiprocessing.get_context("spawn")
        self.stop_services = threading.Event()
        self.summary = drain_mode.RunSummary()
        self.phase = "starting"
        self.run_started = time.monotonic()  # the drain deadline counts from here
        self.received: list[int] = []
        self.stop_deadline = 0.0
        self.deadline_hit = False
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
        self._task_names = sorted(app.tasks)  # a slot's task_index counts in this order

    # -- the run ------------------------------------------------------------------------

    def run(self) -> int:
        from ..metrics import process_metrics

        self.metrics = process_metrics(task_label=self.settings.metrics_task_label)
        tasks_by_queue: dict[str, list[str]] = {}
        for t in self.app.tasks.values():
            tasks_by_queue.setdefault(t.queue, []).append(t.name)
        self.metrics.init_queues(self.queues, tasks_by_queue)
        self.metrics.known_tasks(self.app.tasks)
        self.health.listen_required = self.settings.listen and not self.drain
        provider = tracing.setup_process(self.settings.tracing, trace_sql=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
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
            os._exit(128 + signum)

    def _start_http(self) -> None:
        from ..database_gauges import QueueStatsCollector
        from ..loop_gauges import LoopGauges
        from ..metrics import exposition_registry

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
        try:
            if not wait_for_database(self.settings, self.store, self.health, self.received, drain=self.drain,
                                     max_duration=self.max_duration):
                if self.drain:  # a signal while waiting is a stop, not a failure
                    self.summary.result = "interrupted" if self.received else "failed"
                    drain_mode.report(self.summary, self.pushgateway_url, self.settings.schema)
                    return EXIT_OK if self.received else EXIT_ERROR
                return EXIT_OK
        except (SchemaVersionError, PoolerError) as exc:
            log.error("%s", exc)
            if self.drain:
                self.summary.result = "failed"
                drain_mode.report(self.summary, self.pushgateway_url, self.settings.schema)
            return EXIT_ERROR
        if self.drain:
            drain_mode.before_claiming(self.app, self.connect, self.metrics, schedules=self._schedules_on(),
                                       prune=self.settings.prune)
        limits = {q: c for q, c in self.settings.queue_concurrency if q in self.queues}
        if limits:
            self.pod_limits = PodQueueLimits(limits, n, self.mp)
        self.pool = ClaimerPool(mp=self.mp, count=n, capacity=self.settings.max_batch_size,
                                start_process=self._start_claimer)
        self.health.claimer_problem = lambda: self.pool.write_problem(OUTCOME_WRITE_STALL_SECONDS)
        self._start_services()
        self.pool.start()
        self.phase = "running"
        return self._supervise()

    def _supervise(self) -> int:
        clock = LeaseClock(self._terms(), lambda: self.pool.tables, self._queue_name, self.metrics)
        next_poll = time.monotonic() + self.settings.poll_interval_seconds
        next_hand_back = 0.0
        while True:
            now = time.monotonic()
            self.health.tick()
            if self.phase == "running":
                if self.received:
                    self._begin_stop(f"signal {signal.Signals(self.received[0]).name}")
                elif self.max_duration is not None and now - self.run_started > self.max_duration:
                    self.deadline_hit = True
                    self._begin_stop("drain deadline")
                elif self.drain and self.pool.drained():
                    self._begin_stop("drained")
            for h in self.pool.exited():
                self._claimer_gone(h)
            clock.tick(now)
            # timeouts hold while the pod stops too: a job past its limit fails TIMEOUT then
            # as ever (during the grace it once ran on, and its attempt was given back)
            self.pool.enforce_hard_limits(now)
            if self.phase == "running":
                if now >= next_hand_back:
                    next_hand_back = now + 1.0
                    self._hand_back(now - WAITING_HAND_BACK_SECONDS)
                self.pool.restart_due(now)
                if now >= next_poll and (not self.drain or self.pool.holding_jobs()):
                    # In drain mode while the pod holds a job: a retry or a job scheduled
                    # later that becomes due meanwhile is taken by an idle claimer, not left
                    # for the busy one (a drain run has no LISTEN). Never once nothing is
                    # held: a poll then could only keep waking claimers whose rounds find
                    # nothing, and a round longer than the poll interval (many queues, a
                    # slow network) would keep the run from ever counting as drained.
                    next_poll = now + self.settings.poll_interval_seconds
                    self.announce(-1, "poll")
            elif self.phase == "stopping":
                if self.pool.all_stopped():
                    break
                if now >= self.stop_deadline:
                    self._force_stop()
                    break
            multiprocessing.connection.wait(self.pool.sentinels(), timeout=SUPERVISE_TICK_SECONDS)
        return self._finish()

    def announce(self, queue_index: int, reason: str) -> None:
        """Work is due on a queue (-1: any): wake one idle claimer (pgworker.worker.wakeups)."""
        if self.pool is not None:
            self.signals.announce(self.pool.tables, queue_index)
            self.metrics.wakeup(reason)

    # -- start-up -------------------------------------------------------------------------

    def _schedules_on(self) -> bool:
        return bool(self.settings.schedules and getattr(self.app, "schedules", None))

    def _terms(self) -> LeaseTerms:
        return LeaseTerms(self.settings.lease_seconds, self.settings.effective_renew_interval)

    def _start_services(self) -> None:
        st = self.settings
        common = {"connect": self.connect, "stop": self.stop_services, "health": self.health, "dsn": st.dsn,
                  "pass_timeout": st.statement_timeout_seconds + 5.0}
        self.settler = Settler(store=self.store, metrics=self.metrics, count=self._count, **common)
        renewer = Renewer(terms=self._terms(), tables=lambda: self.pool.tables, holder_alive=self.pool.holder_alive,
                          queue_name=self._queue_name, store=self.store, metrics=self.metrics,
                          **{k: v for k, v in common.items() if k != "pass_timeout"})
        self.services = [renewer, self.settler, registry_of(self, common)]
        if not self.drain:
            self.services.append(Reaper(store=self.store, interval=st.reap_interval_seconds, metrics=self.metrics,
                                        config=ReaperConfig(delay_for=retry_delays(self.app.tasks)), **common))
            if st.prune:
                self.services.append(Pruner(store=self.store, retention=Retention.from_settings(st),
                                            interval=st.prune_interval_seconds, metrics=self.metrics, **common))
            if self._schedules_on():
                self.services.append(SchedulerService(
                    scheduler=Scheduler(self.store, list(self.app.schedules.values())), metrics=self.metrics,
                    **common))
            if st.listen:
                self.services.append(Listener(dsn=st.effective_listen_dsn, channel=self.store.channel,
                                              queues=self.queues, lease_seconds=st.lease_seconds,
                                              announce=self.announce, health=self.health, metrics=self.metrics,
                                              stop=self.stop_services))
        for service in self.services:
            service.start()

    def _start_claimer(self, h: ClaimerHandle) -> Any:
        spec = ClaimerSpec(self.app_ref, self.settings, h.index, tuple(self.pool.tables), tuple(self.queues),
                           self.drain, self.log_level, self.log_format, self.signals, self.pod_limits, os.getpid())
        process = self.mp.Process(target=claimer_main, args=(spec,), name=f"pgworker-claimer-{h.index}")
        process.start()
        return process

    # -- claimers that are gone -----------------------------------------------------------

    def _claimer_gone(self, h: ClaimerHandle) -> None:
        exitcode, pid = h.process.exitcode, h.process.pid
        try:
            held, in_transit = self.pool.held_by(h)
        except SlotTableBusy:
            return  # a peer stopped (SIGSTOP) inside its table holds the lock: a later tick settles it
        stopping = self.phase != "running"
        items = settlements(held, in_transit, app=self.app, queue_name=self._queue_name,
                            kill_reasons=h.kill_reasons, clear=lambda v: None)
        h.process = None
        if pid:  # before its replacement starts: a new claimer may get the same pid
            metrics_files.process_gone(pid)
        if items:
            if stopping:
                self._settle_now(items)
            else:
                self.settler.queue.put(items)
        if self.pod_limits is not None:
            self.pod_limits.clear(h.index)  # its jobs are being settled: no longer the pod's
        self.summary.add(h.table.reset())
        if not stopping:
            self.pool.schedule_restart(h, exitcode, pid, len(held))

    def _settle_now(self, items: list[Any]) -> None:
        """At shutdown, settle on a connection of its own: the services are stopping."""
        try:
            with self.connect("pgworker:settler") as conn:
                settle(self.store, conn, items, self.metrics, self._count)
        except Exception as exc:  # noqa: BLE001 - the leases expire and a reaper recovers the jobs
            log.error("could not settle jobs at shutdown (%s): their leases will expire and a reaper "
                      "will recover them", type(exc).__name__)

    def _count(self, outcome: str, n: int) -> None:
        self.summary.add({outcome: n})

    def _queue_name(self, v: SlotView) -> str:
        return self.queues[v.queue_index] if 0 <= v.queue_index < len(self.queues) else "default"

    # -- shutdown -------------------------------------------------------------------------

    def _begin_stop(self, reason: str) -> None:
        log.info("stopping (%s): no new claims; running jobs have %.0f s to finish", reason,
                 self.settings.shutdown_grace_seconds)
        self.phase = "stopping"
        self.health.reason = "shutting down"  # not ready; still alive until the exit
        self.health.schema_ok = False
        self.stop_deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        self.pool.ask_to_stop()
        self._hand_back(float("inf"))  # jobs not started are not held through the grace

    def _hand_back(self, claimed_before: float) -> None:
        """Release (fenced, no attempt spent) the jobs that have waited unstarted in a
        claimer's batch since before ``claimed_before`` (monotonic), so that any claimer of
        any pod may run them: a batch held behind a long or hung handler once kept its
        other jobs from idle pods until the handler ended (up to its max runtime)."""
        taken = self.pool.take_waiting(claimed_before)
        if not taken:
            return
        items = hand_backs(taken, queue_name=self._queue_name, task_names=self._task_names, cleared=self._handed_back)
        log.info("handing back %s job(s) that waited unstarted behind a running one%s", len(items),
                 " (stopping)" if self.phase != "running" else f" for more than {WAITING_HAND_BACK_SECONDS:.0f} s",
                 extra={"action": "hand_back"})
        if self.settler is not None:
            self.settler.queue.put(items)
        else:
            self._settle_now(items)

    def _handed_back(self, table: Any, v: SlotView) -> None:
        """A handed-back job left its claimer's slots: its share of a per-pod queue limit too."""
        if self.pod_limits is not None and self.pool is not None:
            self.pod_limits.release(self.pool.tables.index(table), self._queue_name(v))

    def _force_stop(self) -> None:
        alive = [h for h in self.pool.handles if h.process is not None]
        log.warning("shutdown grace over: stopping %s claimer(s); their running jobs fail SHUTDOWN (the attempt "
                    "counts) and are due again at once", len(alive))
        for h in alive:
            for job_id in self.pool.running_jobs(h):
                h.kill_reasons.setdefault(job_id, SHUTDOWN)
        self.pool.kill_all()
        for h in alive:
            h.process.join(timeout=5)
            self._claimer_gone(h)

    def _finish(self) -> int:
        self.stop_services.set()
        if self.settler is not None:  # what the settler had not written yet
            self.settler.join(5)
            while not self.settler.queue.empty():
                self._settle_now(self.settler.queue.get_nowait())
        for h in self.pool.handles:
            try:
                held, in_transit = self.pool.held_by(h)
            except SlotTableBusy:
                continue  # a killed claimer still in uninterruptible sleep holds its lock: its leases expire
            items = settlements(held, in_transit, app=self.app, queue_name=self._queue_name,
                                kill_reasons=h.kill_reasons, clear=lambda v: None)
            if items:
                self._settle_now(items)
            self.summary.add(h.table.reset())
        if not self.drain:
            log.info("stopped")
            return EXIT_OK
        # Due jobs left at exit, whatever ended the run: after "drained" it is normally 0
        # (a job that became due in the last moments, or one a global limit kept from
        # this run, shows here rather than being hidden).
        try:
            with self.connect("pgworker:supervisor") as conn:
                self.summary.left = self.store.due_count(conn, self.queues)
                self.summary.next_due_seconds = self.store.next_due_seconds(conn, self.queues)
        except Exception as exc:  # noqa: BLE001
            log.error("could not count the jobs left: %s", type(exc).__name__)
            self.summary.left = -1
        if self.deadline_hit:
            self.summary.result = "deadline" if self.summary.left else "succeeded"
        if self.received:
            self.summary.result = "interrupted"
        drain_mode.report(self.summary, self.pushgateway_url, self.settings.schema)
        if self.deadline_hit and self.summary.left:
            return EXIT_DRAIN_DEADLINE
        return EXIT_OK


def _version() -> str:
    from .._version import __version__

    return __version__

"""The dispatcher: the parent process of ``pgworker run``.

It owns one direct LISTEN connection and wakes idle claimers when a job arrives; runs
the fallback poll, the lease renewer (every live lease of the pod in one fenced
statement per interval) and the reaper; serves /metrics, /healthz and /readyz; and
supervises the claimer processes: a claimer that dies is restarted and the jobs it held
are settled at once by fenced writes (released if they had not started, failed with
WORKER_DIED or TIMEOUT if they had), since the dispatcher knows their tokens.

Shutdown (SIGTERM or SIGINT): stop claiming, give running jobs ``shutdown_grace``
seconds, then release what still runs (fenced, no attempt spent) and exit 0. A second
signal exits at once; leases then expire and a reaper recovers the jobs.

Drain mode (``--drain``): reap first, then claim until nothing is due and nothing is in
flight, and exit 0; no LISTEN, no poll, no reaper timer, no statistics queries. With
``max_duration`` and due work left at the deadline, exit with ``EXIT_DRAIN_DEADLINE``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue as queue_mod
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psycopg
from psycopg import sql

from . import lease as slots_mod
from . import tracing
from .claimer import TIMEOUT, WORKER_DIED, ClaimerSpec, claimer_main
from .config import Settings
from .db import POOLED, OutageLog, connect
from .errors import DatabaseReadOnly, DatabaseUnavailable, PoolerError, SchemaVersionError
from .jobs import FailRequest, Lease
from .podlimits import PodQueueLimits
from .reaper import ReaperConfig, reap_pass
from .schedules import Scheduler
from .retry import RetryPolicy
from .store import BackoffParams

log = logging.getLogger("pgworker.dispatcher")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_DRAIN_DEADLINE = 75  # EX_TEMPFAIL: the deadline passed with due work left; run again
HARD_LIMIT_GRACE_SECONDS = 2.0
RESTART_BACKOFF_MAX_SECONDS = 30.0
# Reconnect backoff cap (seconds): the worst-case delay between the database's return
# and a dispatcher thread noticing it; jitter spreads a fleet's reconnects.
RECONNECT_MAX_SECONDS = 10.0
SUPERVISE_TICK_SECONDS = 0.2


@dataclass
class ClaimerHandle:
    index: int
    table: slots_mod.SlotTable
    process: Any = None
    started_at: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    kill_reasons: dict[int, str] = field(default_factory=dict)


@dataclass
class RunSummary:
    """What a run did, for the drain-mode JSON line and the Pushgateway."""

    counts: dict[str, int] = field(default_factory=lambda: {f: 0 for f in slots_mod.OUTCOME_FIELDS})
    left: int = 0
    started: float = field(default_factory=time.time)
    result: str = "succeeded"

    def add(self, counts: dict[str, int]) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def as_json(self) -> str:
        c = self.counts
        return json.dumps({
            "event": "drain_summary", "result": self.result,
            "processed": sum(c.values()), "succeeded": c["succeeded"], "retried": c["retried"],
            "dead": c["dead"], "cancelled": c["cancelled"], "released": c["released"],
            "snoozed": c["snoozed"], "lost": c["lost"], "left": self.left,
            "duration_seconds": round(time.time() - self.started, 3)}, sort_keys=False)


class Backoff:
    def __init__(self, first: float = 0.5, cap: float = RECONNECT_MAX_SECONDS) -> None:
        self.first, self.cap, self.value = first, cap, first

    def next(self) -> float:
        """The next delay: doubling up to the cap, less up to half at random (jitter)."""
        v, self.value = self.value, min(self.cap, self.value * 2)
        return v * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.value = self.first


class Dispatcher:
    """Runs one pod's worth of claimers. ``run()`` returns the process exit code."""

    def __init__(self, app: Any, app_ref: str, *, drain: bool = False, max_duration: float | None = None,
                 pushgateway_url: str | None = None, log_level: int = logging.INFO,
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
        self.threads_stop = threading.Event()
        self.claimers: list[ClaimerHandle] = []
        self.summary = RunSummary()
        self.phase = "starting"
        self.run_started = time.monotonic()  # the drain deadline counts from here
        self.signals: list[int] = []
        self.stop_deadline = 0.0
        self.deadline_hit = False
        self.work: "queue_mod.Queue[Callable[[psycopg.Connection], None]]" = queue_mod.Queue()
        self.last_ok: dict[tuple[int, int], float] = {}
        self.metrics: Any = None
        self.health: Any = None
        self.http: Any = None
        self.tracer_provider: Any = None
        self._threads: list[threading.Thread] = []
        self._stats_conn: psycopg.Connection | None = None
        self._stats_lock = threading.Lock()
        self.pod_limits: PodQueueLimits | None = None

    # -- set-up ---------------------------------------------------------------------

    def run(self) -> int:
        from .metrics import HealthState, process_metrics

        self.metrics = process_metrics(task_label=self.settings.metrics_task_label)
        tasks_by_queue: dict[str, list[str]] = {}
        for t in self.app.tasks.values():
            tasks_by_queue.setdefault(t.queue, []).append(t.name)
        self.metrics.init_queues(self.queues, tasks_by_queue)
        self.health = HealthState()
        self.health.listen_required = self.settings.listen and not self.drain
        self.tracer_provider = tracing.setup_process(self.settings.tracing, trace_sql=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            if not self.drain and self.settings.metrics_port:
                self._start_http()
            code = self._run()
        finally:
            self.threads_stop.set()
            for t in self._threads:
                t.join(timeout=5)
            if self.http is not None:
                self.http.shutdown()
            if self._stats_conn is not None:
                self._stats_conn.close()
            if self.pod_limits is not None:
                self.pod_limits.close()
            tracing.flush(self.tracer_provider)
        return code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if len(self.signals) >= 2:
            # second signal: exit at once; leases expire and a reaper recovers the jobs
            for h in self.claimers:
                if h.process is not None and h.process.is_alive():
                    os.kill(h.process.pid, signal.SIGKILL)
            log.warning("second signal: exiting now without releasing jobs (leases will expire)")
            os._exit(128 + signum)

    def _start_http(self) -> None:
        from .metrics import QueueStatsCollector, exposition_registry, serve_http

        extra = []
        if self.settings.stats:
            extra.append(QueueStatsCollector(self._fetch_stats, lambda: self.queues,
                                             self.settings.stats_cache_seconds))
        registry = exposition_registry(extra)
        self.http = serve_http(self.settings.metrics_host, self.settings.metrics_port, registry, self.health)
        log.info("serving /metrics, /healthz and /readyz on %s:%s", self.settings.metrics_host,
                 self.http.server_address[1])

    def _fetch_stats(self, queues: list[str]) -> list[dict[str, Any]]:
        with self._stats_lock:
            try:
                if self._stats_conn is None or self._stats_conn.closed or self._stats_conn.broken:
                    # the scrape waits for this: an unreachable server must fail it fast,
                    # not stall /metrics past Prometheus' scrape timeout
                    self._stats_conn = connect(self.settings.dsn, application_name="pgworker:stats",
                                               prepare=self.settings.prepared_statements,
                                               connect_timeout=self.settings.stats_timeout_seconds)
                conn = self._stats_conn
                with conn.transaction():
                    conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                 [f"{int(self.settings.stats_timeout_seconds * 1000)}ms"])
                    return self.store.queue_stats(conn, queues)
            except Exception:
                if self._stats_conn is not None and (self._stats_conn.broken or self._stats_conn.closed):
                    self._stats_conn = None
                raise

    def _wait_for_database(self) -> bool:
        """Connect and check the schema version, retrying while the server is away.
        Returns False when asked to stop (or, in drain mode, after a minute)."""
        backoff = Backoff()
        deadline = time.monotonic() + (60.0 if self.drain else float("inf"))
        logged = False
        while not self.signals:
            try:
                with connect(self.settings.dsn, application_name="pgworker:dispatcher",
                             prepare=self.settings.prepared_statements) as conn:
                    self.store.check_schema_version(conn)
                    pooled = conn in POOLED
                if pooled and self.health.listen_required and not self.settings.listen_dsn:
                    raise PoolerError(
                        "PGWORKER_DSN goes through a connection pooler, and LISTEN needs a session of "
                        "its own (a transaction-mode pooler would drop its notifications): set "
                        "PGWORKER_LISTEN_DSN (--listen-dsn) to a direct connection to PostgreSQL, "
                        "or run with --no-listen to rely on the poll")
                self.health.connected = True
                self.health.schema_ok = True
                return True
            except SchemaVersionError:
                raise
            except DatabaseUnavailable as exc:
                self.health.connected = False
                self.health.reason = "database unavailable"
                if not logged:
                    log.error("%s; retrying with backoff", exc)
                    logged = True
                if time.monotonic() > deadline:
                    return False
                self._sleep(backoff.next())
        return False

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.signals:
            self.health.tick()  # waiting for the database is not being stuck
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # -- the run --------------------------------------------------------------------

    def _run(self) -> int:
        log.info("pgworker %s: %s claimers on queues %s (schema %r)%s", _version(), self.settings.concurrency,
                 ", ".join(self.queues), self.settings.schema, ", drain mode" if self.drain else "")
        try:
            if not self._wait_for_database():
                if self.drain:
                    log.error("drain run gave up: PostgreSQL stayed unreachable for a minute")
                    self.summary.result = "failed"
                    self._report_drain()
                    return EXIT_ERROR
                return EXIT_OK
        except (SchemaVersionError, PoolerError) as exc:
            log.error("%s", exc)
            if self.drain:
                self.summary.result = "failed"
                self._report_drain()
            return EXIT_ERROR
        if self.drain:
            self._drain_reap()
            self._drain_schedules()
        limits = {q: n for q, n in self.settings.queue_concurrency if q in self.queues}
        if limits:
            self.pod_limits = PodQueueLimits(limits, self.settings.concurrency, self.mp)
        self._start_threads()
        for i in range(self.settings.concurrency):
            handle = ClaimerHandle(i, slots_mod.SlotTable(self.settings.max_batch_size, self.mp))
            self.claimers.append(handle)
            self._spawn(handle)
        self.phase = "running"
        started = self.run_started
        next_poll = time.monotonic() + self.settings.poll_interval_seconds
        while True:
            now = time.monotonic()
            self.health.tick()
            if self.phase == "running":
                if self.signals:
                    self._begin_stop(f"signal {signal.Signals(self.signals[0]).name}")
                elif self.max_duration is not None and now - started > self.max_duration:
                    self.deadline_hit = True
                    self._begin_stop("drain deadline")
                elif self.drain and self._drained():
                    self._begin_stop("drained")
            self._reap_exited()
            if self.phase == "running":
                self._enforce_hard_limits(now)
                self._restart_due(now)
                if not self.drain and now >= next_poll:
                    next_poll = now + self.settings.poll_interval_seconds
                    self.wake_all("poll")
            elif self.phase == "stopping":
                if all(h.process is None for h in self.claimers):
                    break
                if now >= self.stop_deadline:
                    self._force_stop()
                    break
            sentinels = [h.process.sentinel for h in self.claimers if h.process is not None]
            multiprocessing.connection.wait(sentinels, timeout=SUPERVISE_TICK_SECONDS)
        return self._finish()

    def _drain_reap(self) -> None:
        """Drain mode has no reaper timer: recover expired leases once, before claiming.
        The requeued jobs are due at once: the gap between scheduled runs is their backoff."""
        try:
            with connect(self.settings.dsn, application_name="pgworker:reaper",
                         prepare=self.settings.prepared_statements) as conn:
                n = reap_pass(self.store, conn, ReaperConfig(backoff=BackoffParams(0.0, 0.0, 0.0)), self.metrics)
            if n:
                log.info("drain: reaped %s expired lease(s) before claiming", n)
        except DatabaseUnavailable as exc:
            log.error("drain: reaping failed: %s", exc)

    def _schedules_enabled(self) -> bool:
        return bool(self.settings.schedules and getattr(self.app, "schedules", None))

    def _drain_schedules(self) -> None:
        """Drain mode has no scheduler thread: fire each schedule's due slot once, before
        claiming (the missed-slot policy applies; the run then drains those jobs too)."""
        if not self._schedules_enabled():
            return
        try:
            with connect(self.settings.dsn, application_name="pgworker:scheduler",
                         prepare=self.settings.prepared_statements) as conn:
                scheduler = Scheduler(self.store, list(self.app.schedules.values()))
                scheduler.register(conn)
                scheduler.tick(conn)
            if scheduler.fired:
                log.info("drain: enqueued %s periodic job(s) before claiming", scheduler.fired)
        except Exception as exc:
            log.error("drain: firing schedules failed: %s", type(exc).__name__)

    def _scheduler_loop(self) -> None:
        Scheduler(self.store, list(self.app.schedules.values())).run(
            self.threads_stop, lambda: connect(self.settings.dsn, application_name="pgworker:scheduler",
                                               prepare=self.settings.prepared_statements))

    def _start_threads(self) -> None:
        targets: list[tuple[str, Callable[[], None]]] = [("pgworker-renewer", self._renewer_loop),
                                                          ("pgworker-maintenance", self._maintenance_loop)]
        if self.settings.listen and not self.drain:
            targets.append(("pgworker-listener", self._listener_loop))
        if self._schedules_enabled() and not self.drain:
            targets.append(("pgworker-scheduler", self._scheduler_loop))
        for name, target in targets:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _spawn(self, h: ClaimerHandle) -> None:
        spec = ClaimerSpec(self.app_ref, self.settings, h.index, h.table, tuple(self.queues), self.drain,
                           self.log_level, self.log_format, self.pod_limits, os.getpid())
        h.process = self.mp.Process(target=claimer_main, args=(spec,), name=f"pgworker-claimer-{h.index}")
        h.process.start()
        h.started_at = time.monotonic()
        h.kill_reasons = {}

    def wake_all(self, reason: str) -> None:
        woke = 0
        for h in self.claimers:
            if h.process is not None:
                h.table.wake.set()
                woke += 1
        if woke:
            self.metrics.wakeup(reason)

    def _drained(self) -> bool:
        for h in self.claimers:
            hdr = h.table.header
            if h.process is None or not hdr.drained or not hdr.idle or _live(h.table, busy=[None]):
                return False
        return True

    # -- supervision ----------------------------------------------------------------

    def _reap_exited(self) -> None:
        for h in self.claimers:
            p = h.process
            if p is None or p.is_alive():
                continue
            p.join()
            self._claimer_gone(h, p.exitcode, p.pid)

    def _claimer_gone(self, h: ClaimerHandle, exitcode: int | None, pid: int | None) -> None:
        held = self._held_by_dead_claimer(h)
        kill_reasons = h.kill_reasons
        h.process = None
        if pid and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid)
        stopping = self.phase != "running"
        if held:
            self._settle_abandoned(held, kill_reasons, release_running=stopping)
        if self.pod_limits is not None:
            self.pod_limits.clear(h.index)  # its jobs are being settled: no longer the pod's
        self.summary.add(h.table.reset())
        if stopping:
            return
        quick = time.monotonic() - h.started_at < 5.0
        if exitcode == 0:
            # recycled (max jobs or memory per child), however soon: not a crash, no backoff
            h.restart_at = time.monotonic()
            h.restarts = 0
        else:
            delay = min(RESTART_BACKOFF_MAX_SECONDS, 0.5 * 2 ** min(h.restarts, 6)) if quick else 0.0
            h.restarts = h.restarts + 1 if quick else 0
            h.restart_at = time.monotonic() + delay
            log.error("claimer %s (pid %s) exited with code %s; restarting in %.1f s (held %s job(s))",
                      h.index, pid, exitcode, delay, len(held))

    def _held_by_dead_claimer(self, h: ClaimerHandle) -> list[slots_mod.SlotView]:
        """What a claimer that is gone held. If it died holding the table's lock (kill -9
        in those few microseconds), nobody can release it: the table gets a new lock."""
        try:
            return h.table.held()
        except slots_mod.SlotTableBusy:
            log.error("claimer %s died holding its slot table's lock; the table gets a new lock", h.index)
            h.table.replace_lock(self.mp)
            return h.table.held()

    def _restart_due(self, now: float) -> None:
        for h in self.claimers:
            if h.process is None and now >= h.restart_at:
                self._spawn(h)

    def _settle_abandoned(self, held: list[slots_mod.SlotView], kill_reasons: dict[int, str], *,
                          release_running: bool) -> None:
        """Settle what a gone claimer held, with fenced writes (its tokens are known)."""
        release = [Lease(v.job_id, v.token) for v in held
                   if v.state == slots_mod.CLAIMED or (release_running and v.job_id not in kill_reasons)]
        release_ids = {le.job_id for le in release}
        policy = RetryPolicy()
        fail = [FailRequest(Lease(v.job_id, v.token), kill_reasons.get(v.job_id, WORKER_DIED),
                            _abandon_message(kill_reasons.get(v.job_id, WORKER_DIED)),
                            policy.delay(max(v.attempt, 1)))
                for v in held if v.job_id not in release_ids and v.state != slots_mod.RELEASING]
        queue_of = {v.job_id: self._queue_name(v) for v in held}
        task_names = sorted(self.app.tasks)
        task_of = {v.job_id: task_names[v.task_index] if 0 <= v.task_index < len(task_names) else "unknown"
                   for v in held}

        def settle(conn: psycopg.Connection) -> None:
            if release:
                report = self.store.release(conn, release)
                self.summary.add({"released": len(report.accepted)})
                for job_id in report.accepted:
                    self.metrics.finished(queue_of[job_id], task_of[job_id], "released", None)
                for job_id in report.refused:
                    self.metrics.fenced(queue_of[job_id], "release")
            if fail:
                report = self.store.fail(conn, fail)
                for job_id, state in report.details.items():
                    outcome = "dead" if state == "dead" else "retried"
                    self.summary.add({outcome: 1})
                    code = next(f.code for f in fail if f.lease.job_id == job_id)
                    self.metrics.finished(queue_of[job_id], task_of[job_id], outcome, None, code)
                for job_id in report.refused:
                    self.metrics.fenced(queue_of[job_id], "fail")
            log.warning("settled the jobs of a stopped claimer: %s released, %s failed",
                        len(release), len(fail), extra={"action": "settle_abandoned"})

        if release_running:
            self._run_now(settle)
        else:
            self.work.put(settle)

    def _enforce_hard_limits(self, now: float) -> None:
        """Stop attempts that ran past their timeout or max runtime: a sync handler cannot
        be interrupted, so its claimer process is killed and the attempt fails TIMEOUT."""
        for h in self.claimers:
            if h.process is None or not h.process.is_alive():
                continue
            for v in _live(h.table):
                if v.state == slots_mod.RUNNING and v.hard_limit > 0 and \
                        now - v.started_at > v.hard_limit + HARD_LIMIT_GRACE_SECONDS:
                    log.error("job %s ran %.0f s, past its limit of %.0f s: stopping claimer %s",
                              v.job_id, now - v.started_at, v.hard_limit, h.index,
                              extra={"action": "timeout", "job_id": v.job_id})
                    h.kill_reasons[v.job_id] = TIMEOUT
                    os.kill(h.process.pid, signal.SIGKILL)
                    break

    # -- shutdown -------------------------------------------------------------------

    def _begin_stop(self, reason: str) -> None:
        log.info("stopping (%s): no new claims; running jobs have %.0f s to finish", reason,
                 self.settings.shutdown_grace_seconds)
        self.phase = "stopping"
        self.health.reason = "shutting down"  # not ready; still alive until the exit
        self.health.schema_ok = False
        self.stop_deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        for h in self.claimers:
            h.table.header.stopping = 1
            h.table.wake.set()
            if h.process is not None and h.process.is_alive():
                try:
                    os.kill(h.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def _force_stop(self) -> None:
        alive = [h for h in self.claimers if h.process is not None]
        log.warning("shutdown grace over: stopping %s claimer(s) and releasing their jobs", len(alive))
        for h in alive:
            try:
                os.kill(h.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for h in alive:
            h.process.join(timeout=5)
            self._claimer_gone(h, h.process.exitcode if h.process else None,
                               h.process.pid if h.process else None)

    def _run_now(self, job: Callable[[psycopg.Connection], None]) -> None:
        try:
            with connect(self.settings.dsn, application_name="pgworker:dispatcher",
                         prepare=self.settings.prepared_statements) as conn:
                job(conn)
        except Exception as exc:
            log.error("could not settle jobs at shutdown (%s): their leases will expire and a reaper "
                      "will recover them", type(exc).__name__)

    def _finish(self) -> int:
        self.threads_stop.set()
        # settle what the maintenance thread had not done yet
        while not self.work.empty():
            self._run_now(self.work.get_nowait())
        for h in self.claimers:
            self._held_by_dead_claimer(h)
            self.summary.add(h.table.reset())
        if not self.drain:
            log.info("stopped")
            return EXIT_OK
        # Due jobs left at exit, whatever ended the run: after "drained" it is normally 0
        # (a job that became due in the last moments, or one a global limit kept from
        # this run, shows here rather than being hidden).
        try:
            with connect(self.settings.dsn, application_name="pgworker:dispatcher",
                         prepare=self.settings.prepared_statements) as conn:
                self.summary.left = self.store.due_count(conn, self.queues)
        except Exception as exc:
            log.error("could not count the jobs left: %s", type(exc).__name__)
            self.summary.left = -1
        if self.deadline_hit:
            self.summary.result = "deadline" if self.summary.left else "succeeded"
        if self.signals:
            self.summary.result = "interrupted"
        self._report_drain()
        if self.deadline_hit and self.summary.left:
            return EXIT_DRAIN_DEADLINE
        return EXIT_OK

    def _report_drain(self) -> None:
        line = self.summary.as_json()
        print(line, flush=True)
        if self.pushgateway_url:
            from .metrics_push import push_drain_summary

            try:
                push_drain_summary(self.pushgateway_url, self.summary, self.settings.schema)
            except Exception as exc:
                log.error("pushing the drain summary to %s failed: %s", self.pushgateway_url, exc)

    # -- threads --------------------------------------------------------------------

    def _listener_loop(self) -> None:
        """LISTEN on a direct connection; wake claimers of the notified queue. On loss:
        reconnect with backoff, LISTEN again, and sweep (wake everyone)."""
        backoff = Backoff()
        first = True
        queues = set(self.queues)
        dsn = self.settings.effective_listen_dsn
        outage = OutageLog(log, "listener", dsn)
        while not self.threads_stop.is_set():
            try:
                with connect(dsn, application_name="pgworker:listener",
                             prepare=False) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.store.channel)))
                    self.health.listening = True
                    self.health.connected = True
                    outage.ok()
                    if not first:
                        self.metrics.listener_reconnected()
                        log.warning("LISTEN connection re-established; sweeping for missed jobs")
                    self.wake_all("reconnect" if not first else "sweep")
                    first = False
                    backoff.reset()
                    while not self.threads_stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload in queues:
                                self.wake_all("notify")
            except Exception as exc:
                self.health.listening = False
                if self.threads_stop.is_set():
                    return
                delay = backoff.next()
                # logged once per outage; the fallback poll keeps claiming meanwhile
                self._db_failed(outage.failed(exc, "LISTEN connection lost; polling continues"))
                self.threads_stop.wait(delay)
        self.health.listening = False

    def _queue_name(self, v: slots_mod.SlotView) -> str:
        return self.queues[v.queue_index] if 0 <= v.queue_index < len(self.queues) else "default"

    def _renewer_loop(self) -> None:
        interval = self.settings.effective_renew_interval
        conn: psycopg.Connection | None = None
        outage = OutageLog(log, "lease renewer", self.settings.dsn)
        while not self.threads_stop.wait(interval):
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = connect(self.settings.dsn, application_name="pgworker:renewer",
                                   prepare=self.settings.prepared_statements)
                if self.renew_once(conn):
                    outage.ok()
                    self._db_ok()
            except Exception as exc:
                # leases are presumed lost once a full lease passes without a renewal
                self._db_failed(outage.failed(exc, "renewing leases"))
                self._renew_failed()
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _renew_candidates(self, now: float) -> list[tuple[slots_mod.SlotTable, slots_mod.SlotView]]:
        lease = self.settings.lease_seconds
        out = []
        for h in self.claimers:
            p = h.process
            # A stopped (SIGSTOP) or dead claimer is not alive: its leases lapse.
            if p is None or not p.is_alive() or slots_mod.process_stopped(p.pid):
                continue
            for v in _live(h.table):  # a table whose lock stays taken: its leases lapse
                if v.lost:
                    continue  # already known lost: renewing it again could only be refused
                if v.hard_limit > 0 and now - v.started_at > v.hard_limit:
                    continue  # renewal stops at the max runtime
                if v.renew_policy == slots_mod.RENEW_PROGRESS and now - v.progress_at > lease:
                    continue  # no progress reported within a lease
                out.append((h.table, v))
        return out

    def renew_once(self, conn: psycopg.Connection) -> bool:
        """Renew every live lease of the pod in one fenced statement. Returns whether a
        statement ran (and so the database answered)."""
        now = time.monotonic()
        candidates = self._renew_candidates(now)
        self._presume_lost(now, exclude={(v.job_id, v.token) for _, v in candidates})
        if not candidates:
            return False
        leases = [Lease(v.job_id, v.token) for _, v in candidates]
        report = self.store.renew(conn, leases, lease_seconds=self.settings.lease_seconds)
        accepted = set(report.accepted)
        per_queue: dict[str, dict[str, int]] = {}
        for table, v in candidates:
            q = self._queue_name(v)
            counts = per_queue.setdefault(q, {"renewed": 0, "lost": 0})
            if v.job_id in accepted:
                self.last_ok[(v.job_id, v.token)] = now
                counts["renewed"] += 1
                if report.details.get(v.job_id):
                    _mark(table, v, cancel=True)
            elif _mark(table, v, lost=True):
                counts["lost"] += 1
                self.metrics.fenced(q, "renew")
                log.warning("lease lost on job %s (token %s): the renewal was refused", v.job_id, v.token,
                            extra={"action": "lease_lost", "job_id": v.job_id, "queue": q})
        for q, counts in per_queue.items():
            self.metrics.renewals(q, "renewed", counts["renewed"])
            self.metrics.renewals(q, "lost", counts["lost"])
            tracing.batch_span("renew", q, counts["renewed"] + counts["lost"], lost=counts["lost"])
        live = {(v.job_id, v.token) for _, v in candidates}
        for key in [k for k in self.last_ok if k not in live]:
            del self.last_ok[key]
        return True

    def _renew_failed(self) -> None:
        now = time.monotonic()
        for h in self.claimers:
            for v in _live(h.table):
                self.metrics.renewals(self._queue_name(v), "error", 1)
        self._presume_lost(now, exclude=set())

    def _presume_lost(self, now: float, exclude: set[tuple[int, int]]) -> None:
        """A lease not renewed for a whole lease has expired in the database too: tell
        its handler, so the duplicate-execution window stays within one lease."""
        lease = self.settings.lease_seconds
        for h in self.claimers:
            for v in _live(h.table):
                key = (v.job_id, v.token)
                if key in exclude or v.lost:  # reported once, when it was first found lost
                    continue
                last = self.last_ok.get(key, v.claimed_at)
                if now - last > lease and _mark(h.table, v, lost=True):
                    q = self._queue_name(v)
                    self.metrics.renewals(q, "lost", 1)
                    log.warning("lease on job %s presumed lost: not renewed for %.0f s", v.job_id, now - last,
                                extra={"action": "lease_lost", "job_id": v.job_id, "queue": q})

    def _db_failed(self, kind: str) -> None:
        """What /readyz says while the database is away or read-only."""
        if kind == "read-only":
            self.health.writable = False
            self.health.reason = "database is read-only (a standby?): waiting for a writable primary"
        elif kind == "unreachable":
            self.health.connected = False
            self.health.reason = "database unavailable"
        elif kind == "prepared-statements":
            self.health.reason = "prepared statements fail behind a pooler: set PGWORKER_PREPARED_STATEMENTS=false"

    def _db_ok(self) -> None:
        """A write went through: connected and writable again."""
        self.health.connected = True
        self.health.writable = True
        if self.health.reason != "shutting down":
            self.health.reason = "ok"

    def _maintenance_loop(self) -> None:
        """Reaper timer (not in drain mode) and the dispatcher's own fenced writes."""
        conn: psycopg.Connection | None = None
        next_reap = time.monotonic() + min(5.0, self.settings.reap_interval_seconds)
        backoff = Backoff()
        config = ReaperConfig()
        outage = OutageLog(log, "maintenance (reaper)", self.settings.dsn)
        while not self.threads_stop.is_set():
            try:
                job = self.work.get(timeout=0.5)
            except queue_mod.Empty:
                job = None
            reap = not self.drain and time.monotonic() >= next_reap
            if job is None and not reap:
                continue
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = connect(self.settings.dsn, application_name="pgworker:maintenance",
                                   prepare=self.settings.prepared_statements)
                    self.health.connected = True
                if job is not None:
                    job(conn)
                if reap:
                    if not self.store.server_writable(conn):
                        raise DatabaseReadOnly("the server is read-only (a standby, or "
                                               "default_transaction_read_only is on)")
                    reap_pass(self.store, conn, config, self.metrics)
                    next_reap = time.monotonic() + self.settings.reap_interval_seconds
                backoff.reset()
                outage.ok()
                self._db_ok()
            except Exception as exc:
                self._db_failed(outage.failed(exc))
                if job is not None:
                    self.work.put(job)
                delay = backoff.next()
                if conn is not None:
                    conn.close()
                conn = None
                next_reap = time.monotonic() + delay
                self.threads_stop.wait(delay)
        if conn is not None:
            conn.close()


def _live(table: slots_mod.SlotTable, busy: Any = None) -> list[slots_mod.SlotView]:
    """The table's live slots; when its lock stays taken (its claimer is stopped, or died
    holding it), nothing this round, or ``busy`` if given."""
    try:
        return table.live()
    except slots_mod.SlotTableBusy:
        return [] if busy is None else busy


def _mark(table: slots_mod.SlotTable, v: slots_mod.SlotView, *, lost: bool = False, cancel: bool = False) -> bool:
    try:
        return table.mark(v.index, v.job_id, v.token, lost=lost, cancel=cancel)
    except slots_mod.SlotTableBusy:
        return False


def _abandon_message(code: str) -> str:
    if code == TIMEOUT:
        return "the attempt ran past its timeout or max runtime; its claimer process was stopped"
    return "the claimer process running this attempt died before recording an outcome"


def _version() -> str:
    from . import __version__

    return __version__

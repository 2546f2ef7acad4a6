"""Prometheus metrics counted in the worker's processes, and the registry /metrics serves.

Under ``pgworker run`` every process writes its counters to ``PROMETHEUS_MULTIPROC_DIR``
(prometheus_client multiprocess mode; the CLI sets the directory and wipes it before the
library is imported) and the supervisor serves the merged view. Counters of a claimer
killed with ``kill -9`` survive in its files; when a claimer is gone its
``livesum``/``livemin`` gauges go and its other values are merged into the pod's
compacted files (:mod:`pgworker.metrics_files`). Outside ``pgworker run`` (a
web process that enqueues) the same metrics live in the default registry.

Labels are bounded: queue, task (switchable off), outcome, result, operation, action,
reason, cause, and error_class folded to 'other' past the first 20 classes a pod sees
(:mod:`pgworker.error_classes`); unregistered task names share one value. The gauges
read from PostgreSQL at scrape time are in :mod:`pgworker.database_gauges`.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from typing import Any, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ._version import __version__
from . import catalogue as cat
from .error_classes import ErrorClassBudget
from .metrics_files import multiproc_dir

log = logging.getLogger("pgworker.metrics")


def multiprocess_enabled() -> bool:
    return bool(multiproc_dir())


class WorkerMetrics:
    """The counters, histograms and gauges every pgworker process records.

    Methods are named after the events of the job lifecycle; each updates the
    catalogue's metrics for it. ``registry=None`` uses the default registry.

    Cost: an event is one to three updates of a value in this process's mmap file
    (multiprocess mode) or in memory; labelled children are looked up once and cached,
    since ``labels()`` costs as much as the update itself.
    """

    # Created on a claimer's first heartbeat, not here: a labelless gauge is written
    # (as 0) to its process's file the moment it exists, and 0 from the supervisor or a
    # producer would then be the "oldest heartbeat" of the pod (livemin).
    LAZY = ("pgworker_claimer_heartbeat_timestamp_seconds",)

    def __init__(self, registry: CollectorRegistry | None = None, *, task_label: bool = True) -> None:
        self.task_label = task_label
        # the pod's budget under `pgworker run` (its multiprocess directory), else this process's
        self._error_classes = ErrorClassBudget(cat.ERROR_CLASS_TOP_N, cat.KNOWN_ERROR_CODES, cat.OTHER,
                                               multiproc_dir() if registry is None else None)
        self._lock = threading.Lock()
        self._kw: dict[str, Any] = {} if registry is None else {"registry": registry}
        self._children: dict[tuple[str, ...], Any] = {}
        self._heartbeat: Any = None
        self._known_tasks: frozenset[str] | None = None
        m: dict[str, Any] = {}
        for d in cat.METRICS:
            if d.source == "worker" and d.name not in self.LAZY:
                m[d.name] = _build(d, self._kw)
        self.m = m
        m["pgworker_build_info"].labels(__version__).set(1)

    def _child(self, name: str, *labels: str) -> Any:
        """The labelled child of metric ``name``, cached (dict lookups are thread-safe)."""
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.m[name].labels(*labels)
        return child

    # -- known label sets start at 0 -------------------------------------------------

    def init_queues(self, queues: Iterable[str], tasks_by_queue: dict[str, Sequence[str]] | None = None) -> None:
        """Create the series of known label sets at 0, so rates work from the start."""
        c = self._child
        for q in queues:
            for r in cat.CLAIM_RESULTS:
                c("pgworker_claims_total", q, r)
            c("pgworker_claimed_jobs_total", q)
            c("pgworker_claim_duration_seconds", q)
            c("pgworker_job_wait_duration_seconds", q)
            c("pgworker_job_unblock_wait_duration_seconds", q)
            c("pgworker_lease_overrun_seconds", q)
            c("pgworker_enqueued_jobs_total", q)
            for r in cat.RENEW_RESULTS:
                c("pgworker_lease_renewals_total", q, r)
            for a in cat.EXPIRATION_ACTIONS:
                c("pgworker_lease_expirations_total", q, a)
            c("pgworker_reap_failed_total", q)
            for op in cat.FENCED_OPERATIONS:
                c("pgworker_fenced_writes_total", q, op)
            c("pgworker_steps_skipped_total", q)
            c("pgworker_effects_uncertain_total", q)
            for r in cat.EFFECT_RECONCILE_RESULTS:
                c("pgworker_effects_reconciled_total", q, r)
            tasks = (tasks_by_queue or {}).get(q, ()) if self.task_label else ("",)
            for t in tasks:
                for o in cat.OUTCOMES:
                    c("pgworker_jobs_finished_total", q, t, o)
            for code in cat.KNOWN_ERROR_CODES:
                c("pgworker_jobs_dead_total", q, code)
        for r in cat.WAKEUP_REASONS:
            c("pgworker_dispatcher_wakeups_total", r)
        for r in cat.OUTCOME_WRITE_ERRORS:
            c("pgworker_outcome_write_errors_total", r)
        for st in cat.PRUNED_STATES:
            c("pgworker_jobs_pruned_total", st)

    def known_tasks(self, names: Iterable[str]) -> None:
        """The tasks this process registered: any other task name is counted as
        ``unregistered`` (one bounded label value, whatever names jobs carry)."""
        self._known_tasks = frozenset(names)

    def _task(self, task: str) -> str:
        if not self.task_label:
            return ""
        known = self._known_tasks
        return task if known is None or task in known else cat.UNREGISTERED_TASK

    def error_class(self, code: str) -> str:
        """Fold error classes past the first N (catalogue.ERROR_CLASS_TOP_N) that the pod
        sees into 'other' (:mod:`pgworker.error_classes`); pgworker's own codes never count
        against N."""
        return self._error_classes.label(code)

    # -- events ---------------------------------------------------------------------

    def enqueued(self, queue: str, count: int) -> None:
        self._child("pgworker_enqueued_jobs_total", queue).inc(count)

    def claimed(self, queue: str, count: int, seconds: float, waits: Iterable[float],
                jobs: Iterable[Any] = ()) -> None:
        """One claim statement: its result, latency (seconds) and each job's wait (seconds);
        ``jobs`` (ClaimedJob): the dependents among them add their unblock wait."""
        c = self._child
        c("pgworker_claims_total", queue, "claimed" if count else "empty").inc()
        c("pgworker_claim_duration_seconds", queue).observe(seconds)
        if count:
            c("pgworker_claimed_jobs_total", queue).inc(count)
            observe_many(c("pgworker_job_wait_duration_seconds", queue), [max(0.0, w) for w in waits])
            unblocked = [max(0.0, w) for j in jobs if (w := j.unblock_wait_seconds) is not None]
            if unblocked:
                observe_many(c("pgworker_job_unblock_wait_duration_seconds", queue), unblocked)

    def claim_error(self, queue: str) -> None:
        self._child("pgworker_claims_total", queue, "error").inc()

    def finished(self, queue: str, task: str, outcome: str, run_seconds: float | None,
                 error_code: str | None = None) -> None:
        """One attempt settled with ``outcome``; ``run_seconds`` is the handler's run time
        (None when the handler never ran, e.g. a release); ``error_code`` for retried/dead."""
        c = self._child
        t = self._task(task)
        c("pgworker_jobs_finished_total", queue, t, outcome).inc()
        if run_seconds is not None:
            c("pgworker_job_run_duration_seconds", queue, t, outcome).observe(run_seconds)
        if outcome == "retried":
            c("pgworker_job_retries_total", queue, self.error_class(error_code or "unknown")).inc()
        elif outcome == "dead":
            c("pgworker_jobs_dead_total", queue, self.error_class(error_code or "unknown")).inc()

    def finished_many(self, queue: str, task: str, outcome: str, run_seconds: Sequence[float | None],
                      error_code: str | None = None) -> None:
        """:meth:`finished` for a group of attempts with the same labels (one entry per
        attempt, None when it never ran): one counter update and one histogram update for
        the group, as the claimer records a whole flush at once."""
        c = self._child
        t = self._task(task)
        n = len(run_seconds)
        if not n:
            return
        c("pgworker_jobs_finished_total", queue, t, outcome).inc(n)
        ran = [v for v in run_seconds if v is not None]
        if ran:
            observe_many(c("pgworker_job_run_duration_seconds", queue, t, outcome), ran)
        if outcome == "retried":
            c("pgworker_job_retries_total", queue, self.error_class(error_code or "unknown")).inc(n)
        elif outcome == "dead":
            c("pgworker_jobs_dead_total", queue, self.error_class(error_code or "unknown")).inc(n)

    def lease_overrun(self, queue: str, seconds: float) -> None:
        """A refused write's attempt ran ``seconds`` past its lease's expiry."""
        self._child("pgworker_lease_overrun_seconds", queue).observe(max(0.0, seconds))

    def fenced(self, queue: str, operation: str, count: int = 1) -> None:
        self._child("pgworker_fenced_writes_total", queue, operation).inc(count)

    def step_skipped(self, queue: str) -> None:
        """A step or effect found recorded by an earlier attempt: not run again."""
        self._child("pgworker_steps_skipped_total", queue).inc()

    def effect_reconciled(self, queue: str, result: str) -> None:
        """An uncertain effect settled by reconcile: ``result`` happened | not_happened."""
        self._child("pgworker_effects_reconciled_total", queue, result).inc()

    def effect_uncertain(self, queue: str) -> None:
        """An uncertain effect with no reconcile function: the job goes dead EFFECT_UNCERTAIN."""
        self._child("pgworker_effects_uncertain_total", queue).inc()

    def renewals(self, queue: str, result: str, count: int) -> None:
        if count:
            self._child("pgworker_lease_renewals_total", queue, result).inc(count)

    def expirations(self, queue: str, action: str, count: int) -> None:
        if count:
            self._child("pgworker_lease_expirations_total", queue, action).inc(count)
            if action == "dead":
                self._child("pgworker_jobs_dead_total", queue, "LEASE_EXPIRED").inc(count)

    def in_flight(self, queue: str, delta: int) -> None:
        g = self._child("pgworker_jobs_in_flight", queue)
        g.inc(delta) if delta >= 0 else g.dec(-delta)

    def set_in_flight(self, queue: str, value: int) -> None:
        self._child("pgworker_jobs_in_flight", queue).set(value)

    def loop_heartbeat(self) -> None:
        """A claimer is alive and making progress (see the catalogue's help text)."""
        g = self._heartbeat
        if g is None:
            with self._lock:
                if self._heartbeat is None:
                    self._heartbeat = _build(cat.METRICS_BY_NAME["pgworker_claimer_heartbeat_timestamp_seconds"],
                                             self._kw)
                g = self._heartbeat
        g.set(time.time())

    def wakeup(self, reason: str, count: int = 1) -> None:
        if count:
            self._child("pgworker_dispatcher_wakeups_total", reason).inc(count)

    def listener_reconnected(self) -> None:
        self.m["pgworker_listener_reconnects_total"].inc()

    def outcome_write_error(self, cause: str) -> None:
        """One failed outcome write (cause: connection, statement or invalid_value)."""
        self._child("pgworker_outcome_write_errors_total", cause).inc()

    def reap_skipped(self, count: int) -> None:
        if count:
            self.m["pgworker_reap_skipped_total"].inc(count)

    def reap_failed(self, queue: str) -> None:
        """An expired lease whose row the reaper could not write."""
        self._child("pgworker_reap_failed_total", queue).inc()

    def pruned(self, state: str, count: int) -> None:
        if count:
            self._child("pgworker_jobs_pruned_total", state).inc(count)

    def schedule_errors(self, count: int) -> None:
        if count:
            self.m["pgworker_schedule_errors_total"].inc(count)


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """Observe every value in a labelled histogram child with one update per bucket.

    In multiprocess mode each update is a locked write to a memory-mapped file, so a
    claim of 100 jobs costs 2 writes per bucket touched instead of 200. This reads the
    child's bucket layout (``_upper_bounds``, ``_buckets``, ``_sum``: prometheus_client's
    own non-cumulative buckets, as ``Histogram.observe`` updates them); should a release
    change that layout, it falls back to ``observe`` per value.
    """
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:
        for v in values:
            histogram.observe(v)
        return
    counts: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)  # the first bucket whose bound >= v
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in counts.items():
        buckets[i].inc(n)


def _build(d: cat.MetricDef, kw: dict[str, Any]) -> Any:
    if d.kind == "counter":
        # prometheus_client appends _total itself
        return Counter(d.name.removesuffix("_total"), d.help, d.labels, **kw)
    if d.kind == "histogram":
        return Histogram(d.name, d.help, d.labels, buckets=d.buckets, **kw)
    return Gauge(d.name, d.help, d.labels, multiprocess_mode=d.multiprocess_mode or "all", **kw)


_process_metrics: WorkerMetrics | None = None
_process_metrics_pid = 0
_process_metrics_lock = threading.Lock()


def process_metrics(*, task_label: bool = True) -> WorkerMetrics:
    """This process's :class:`WorkerMetrics` (created once per process)."""
    global _process_metrics, _process_metrics_pid
    with _process_metrics_lock:
        if _process_metrics is None or _process_metrics_pid != os.getpid():
            _process_metrics = WorkerMetrics(task_label=task_label)
            _process_metrics_pid = os.getpid()
        return _process_metrics


def exposition_registry(extra: Iterable[Any] = ()) -> CollectorRegistry:
    """The registry ``/metrics`` serves: the merged multiprocess files (or the default
    registry outside multiprocess mode) plus ``extra`` collectors."""
    if multiprocess_enabled():
        from .metrics_files import exposition_collector

        registry = CollectorRegistry()
        exposition_collector(registry)
    else:
        from prometheus_client import REGISTRY

        registry = CollectorRegistry()
        registry.register(_Delegate(REGISTRY))
    for c in extra:
        registry.register(c)
    return registry


class _Delegate:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()

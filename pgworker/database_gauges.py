"""Gauges read from PostgreSQL when /metrics is scraped: the queue statistics
(``pgworker_queue_*``) and the jobs table's health (``pgworker_table_*``).

Registered in the process that serves /metrics only (the supervisor of ``pgworker run``):
one cached fetch (:class:`pgworker.worker.stats.StatsSource`) under a statement timeout,
so many scrapers cost one query per cache period, and a failure shows as a ``*_stats_up``
gauge at 0, never as a broken /metrics.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily

from . import catalogue as cat

log = logging.getLogger("pgworker.metrics")


class QueueStatsCollector:
    """Collects ``pgworker_queue_*`` gauges with one query, cached for a few seconds.

    Register it in the exporting process only. ``fetch(queues)`` runs the statistics
    statement (under a statement timeout) and returns rows; a failure sets
    ``pgworker_queue_stats_up`` to 0 and keeps the last good values out of the output.

    It also exports the ``pgworker_table_*`` gauges (:class:`TableHealthGauges`) from
    the ``table`` row that ``Store.queue_stats`` reads in the same transaction: same
    timeout, same cache, switched off with it (``--no-stats``).
    """

    def __init__(self, fetch: Callable[[Sequence[str]], list[dict[str, Any]]],
                 queues: Callable[[], Sequence[str]], cache_seconds: float) -> None:
        self._fetch = fetch
        self._queues = queues
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._at = 0.0
        self._rows: list[dict[str, Any]] = []
        self._up = 0
        self._duration = 0.0
        self._table_health = TableHealthGauges()

    def refresh(self, force: bool = False) -> None:
        with self._lock:
            if not force and time.monotonic() - self._at < self._cache_seconds:
                return
            t0 = time.perf_counter()
            try:
                self._rows = self._fetch(list(self._queues()))
                self._up = 1
            except Exception as exc:  # reported as stats_up 0; never breaks /metrics
                log.warning("queue statistics query failed: %s", type(exc).__name__)
                self._rows = []
                self._up = 0
            self._table_health.update(self._rows)
            self._duration = time.perf_counter() - t0
            self._at = time.monotonic()

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        self.refresh()
        d = cat.METRICS_BY_NAME
        jobs = GaugeMetricFamily("pgworker_queue_jobs", d["pgworker_queue_jobs"].help, labels=["queue", "state"])
        age = GaugeMetricFamily("pgworker_queue_oldest_job_age_seconds",
                                d["pgworker_queue_oldest_job_age_seconds"].help, labels=["queue"])
        dead_age = GaugeMetricFamily("pgworker_queue_oldest_dead_job_age_seconds",
                                     d["pgworker_queue_oldest_dead_job_age_seconds"].help, labels=["queue"])
        expired = GaugeMetricFamily("pgworker_queue_expired_leases",
                                    d["pgworker_queue_expired_leases"].help, labels=["queue"])
        dead_keys = GaugeMetricFamily("pgworker_queue_dead_blocked_ordering_keys",
                                      d["pgworker_queue_dead_blocked_ordering_keys"].help, labels=["queue"])
        paused = GaugeMetricFamily("pgworker_queue_paused", d["pgworker_queue_paused"].help, labels=["queue"])
        waiting = GaugeMetricFamily("pgworker_queue_waiting_on_parents",
                                    d["pgworker_queue_waiting_on_parents"].help, labels=["queue"])
        behind_dead = GaugeMetricFamily("pgworker_queue_blocked_by_dead_parent_age_seconds",
                                        d["pgworker_queue_blocked_by_dead_parent_age_seconds"].help, labels=["queue"])
        for row in self._rows:
            q = row["queue"]
            for state in cat.STATS_STATES:
                jobs.add_metric([q, state], float(row[state]))
            age.add_metric([q], float(row["oldest_due_age_seconds"]))
            dead_age.add_metric([q], float(row["oldest_dead_age_seconds"]))
            expired.add_metric([q], float(row["expired_leases"]))
            dead_keys.add_metric([q], float(row["dead_blocked_keys"]))
            paused.add_metric([q], 1.0 if row["paused"] else 0.0)
            waiting.add_metric([q], float(row.get("waiting_on_parents", 0)))
            behind_dead.add_metric([q], float(row.get("blocked_by_dead_parent_age_seconds", 0.0)))
        yield from (jobs, age, dead_age, expired, dead_keys, paused, waiting, behind_dead)
        yield GaugeMetricFamily("pgworker_queue_stats_up", d["pgworker_queue_stats_up"].help, value=self._up)
        yield GaugeMetricFamily("pgworker_queue_stats_duration_seconds",
                                d["pgworker_queue_stats_duration_seconds"].help, value=self._duration)
        yield from self._table_health.families()


# ---- the jobs table's health (pgworker_table_*) ---------------------------------------


def holder_label(text: str | None) -> str:
    """A horizon holder's name or state as a label value: its characters outside
    printable ASCII become ``?`` (as PostgreSQL does to an application_name), runs of
    spaces one space, cut to ``catalogue.HOLDER_LABEL_MAX_CHARS`` characters. These
    values come from outside pgworker (any client's application_name, a slot's or a
    prepared transaction's name); only one holder is ever exported at a time."""
    text = " ".join((text or "").split())
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:cat.HOLDER_LABEL_MAX_CHARS]


class TableHealthGauges:
    """The ``pgworker_table_*`` gauges, from the ``table_health`` row (see
    ``pgworker/sql/queries/health.sql``, which says where each figure comes from).

    :meth:`update` takes what the statistics fetch returned: a ``store.QueueStats``
    carries the row in ``table`` (None when its statement failed, with ``table_error``);
    a plain list (a failed fetch leaves ``[]``) has none. Without a row only
    ``pgworker_table_stats_up 0`` is exported: absent, not stale.

    Cardinality: one series per gauge, except ``pgworker_table_last_vacuum_age_seconds``
    (two: manual, auto) and the two horizon gauges, which carry the labels of the single
    oldest holder (:func:`holder_label`): when the holder changes, its series is replaced.

    The horizon age in seconds is PostgreSQL's when it records one (a session's
    xact_start, a prepared transaction's time). A replication slot records none, and a
    session's xact_start is hidden from roles that are not its own nor members of
    pg_read_all_stats: then it is the time since this process first saw the same holder
    hold the horizon at the same xid (monotonic clock), a lower bound that restarts with
    the process. Only the current holder is remembered.
    """

    def __init__(self) -> None:
        self.up = 0
        self._row: dict[str, Any] | None = None
        self._held_seconds = 0.0
        self._first_seen: tuple[tuple[str, str, str], float] | None = None  # (holder, name, xid), when

    def update(self, rows: Sequence[Any]) -> None:
        """Take the ``table`` row of a statistics fetch (see the class docstring)."""
        row = getattr(rows, "table", None)
        error = getattr(rows, "table_error", None)
        if error:  # a failed fetch as a whole was logged by the collector already
            log.warning("jobs table health query failed: %s", error)
        self._row = row
        self.up = 1 if row is not None else 0
        if row is None or row["holder"] is None:
            self._held_seconds = 0.0
            return
        held = row["held_seconds"]
        if held is None:
            key = (row["holder"], row["holder_name"], row["horizon_xid"])
            now = time.monotonic()
            if self._first_seen is None or self._first_seen[0] != key:
                self._first_seen = (key, now)
            held = now - self._first_seen[1]
        # another session's xact_start can be a moment after this transaction's now()
        self._held_seconds = max(0.0, float(held))

    def families(self) -> list[Any]:
        d = cat.METRICS_BY_NAME

        def gauge(name: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, d[name].help, labels=list(labels))

        up = gauge("pgworker_table_stats_up")
        up.add_metric([], float(self.up))
        row = self._row
        if row is None:
            return [up]
        live, dead = gauge("pgworker_table_live_tuples"), gauge("pgworker_table_dead_tuples")
        live.add_metric([], float(row["live_tuples"]))
        dead.add_metric([], float(row["dead_tuples"]))
        vacuum = gauge("pgworker_table_last_vacuum_age_seconds", ["vacuum"])
        for kind, column in zip(cat.VACUUM_KINDS, ("last_vacuum_age_seconds", "last_autovacuum_age_seconds")):
            # never vacuumed (since the statistics were reset): longer ago than any bound
            vacuum.add_metric([kind], math.inf if row[column] is None else max(0.0, float(row[column])))
        size = gauge("pgworker_table_size_bytes")
        size.add_metric([], float(row["size_bytes"]))
        age = gauge("pgworker_table_horizon_age_seconds", cat.HORIZON_LABELS)
        lag = gauge("pgworker_table_horizon_lag_transactions", cat.HORIZON_LABELS)
        if row["holder"] is None:
            labels = ["none", "", ""]
        else:
            labels = [row["holder"], holder_label(row["holder_name"]), holder_label(row["holder_state"])]
        age.add_metric(labels, self._held_seconds)
        lag.add_metric(labels, float(row["lag_transactions"] or 0))
        return [live, dead, vacuum, size, age, lag, up]

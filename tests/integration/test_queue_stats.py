"""The queue statistics behind the pgworker_queue_* gauges: one query, under a statement
timeout, cached; a failure reports pgworker_queue_stats_up 0 and never breaks /metrics."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql
from prometheus_client import CollectorRegistry

from pgworker.worker.stats import StatsSource
from pgworker.database_gauges import QueueStatsCollector
from worker import q

pytestmark = pytest.mark.integration
CACHE_SECONDS = 1.0


@pytest.fixture
def stats(app):
    """The supervisor's real statistics fetch (its own connection, its timeout) behind a
    collector; calls counts the queries that reached the database."""
    app.configure(app.settings.replace(stats_timeout_seconds=0.5))
    source = StatsSource(app.store, app.settings)
    calls: list[float] = []

    def fetch(queues):
        calls.append(time.monotonic())
        return source.fetch(queues)

    collector = QueueStatsCollector(fetch, lambda: ["default", "emails"], cache_seconds=CACHE_SECONDS)
    registry = CollectorRegistry()
    registry.register(collector)
    yield registry, calls
    source.close()


def test_figures_come_from_the_database(app, stats, conn):
    registry, _ = stats
    app.enqueue_many([("t", i) for i in range(3)])
    app.enqueue("t", queue="emails", delay=3600)  # pending, not due
    [job] = app.claim(limit=1)
    q(conn, app.settings.schema, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1s' WHERE id = %s "
                                 "RETURNING id", job.id)
    q(conn, app.settings.schema, "UPDATE {s}.jobs SET run_at = now() - interval '30s' WHERE id IN "
                                 "(SELECT id FROM {s}.jobs WHERE state = 'pending' AND queue = 'default' LIMIT 1) "
                                 "RETURNING id")
    get = registry.get_sample_value
    assert get("pgworker_queue_stats_up") == 1
    assert get("pgworker_queue_jobs", {"queue": "default", "state": "due"}) == 2
    assert get("pgworker_queue_jobs", {"queue": "default", "state": "running"}) == 1
    assert get("pgworker_queue_jobs", {"queue": "emails", "state": "due"}) == 0
    assert get("pgworker_queue_jobs", {"queue": "emails", "state": "scheduled"}) == 1
    assert get("pgworker_queue_expired_leases", {"queue": "default"}) == 1
    assert 30 <= get("pgworker_queue_oldest_job_age_seconds", {"queue": "default"}) < 60
    assert get("pgworker_queue_oldest_job_age_seconds", {"queue": "emails"}) == 0  # nothing due
    assert get("pgworker_queue_oldest_dead_job_age_seconds", {"queue": "default"}) == 0


def test_due_work_is_counted_apart_from_jobs_scheduled_later(app, stats):
    """10,000 jobs scheduled an hour ahead and one due job: the queue's due work is 1
    (what KEDA and the backlog alerts read), and the 10,000 show as scheduled, not as
    pending (the gauge read 10,001 pending). Every pending job is in exactly one of due,
    scheduled or blocked, so a sum over the states counts each job once."""
    registry, _ = stats
    app.enqueue_many([{"task": "t", "payload": i, "delay": 3600} for i in range(10_000)])
    app.enqueue("t")
    app.enqueue("t", ordering_key="k")
    app.enqueue("t", ordering_key="k")  # blocked behind the first
    get = registry.get_sample_value
    figures = {state: get("pgworker_queue_jobs", {"queue": "default", "state": state})
               for state in ("due", "scheduled", "blocked", "running", "dead")}
    assert figures == {"due": 2, "scheduled": 10_000, "blocked": 1, "running": 0, "dead": 0}
    assert get("pgworker_queue_jobs", {"queue": "default", "state": "pending"}) is None


def test_one_query_per_cache_period(app, stats):
    registry, calls = stats
    for _ in range(5):
        registry.get_sample_value("pgworker_queue_stats_up")
    assert len(calls) == 1
    time.sleep(CACHE_SECONDS + 0.05)  # the cache period is the subject here
    registry.get_sample_value("pgworker_queue_stats_up")
    assert len(calls) == 2


def test_a_blocked_query_times_out_and_reports_down(app, stats, pg_dsn):
    """A table lock makes the query wait: the statement timeout ends it, the gauges go
    (absent, not stale) and stats_up says 0; when the lock goes, so does the failure."""
    registry, _ = stats
    get = registry.get_sample_value
    with psycopg.connect(pg_dsn) as locker:
        locker.execute(sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(app.settings.schema)))
        t0 = time.monotonic()
        assert get("pgworker_queue_stats_up") == 0
        assert time.monotonic() - t0 < 5  # the timeout (0.5 s), not the lock, decided
        assert 0.4 <= get("pgworker_queue_stats_duration_seconds") < 5
        assert get("pgworker_queue_jobs", {"queue": "default", "state": "due"}) is None
        locker.rollback()
    time.sleep(CACHE_SECONDS + 0.05)  # the failure is cached too
    assert get("pgworker_queue_stats_up") == 1

"""The PromQL that answers the common questions about a pgworker deployment.

docs/observability.md prints these (:mod:`pgworker.metrics_docs`); the tests run each
through promtool, check its names and labels against the catalogue
(:mod:`pgworker.catalogue`), and query a real Prometheus server scraping a real worker
with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    """One PromQL expression a user needs, with what its value means."""

    expr: str
    meaning: str


#: The common questions and the PromQL that answers each. The pgworker_queue_* gauges
#: come from the database, so every pod reports the same figure: take max, not sum.
QUESTIONS: tuple[tuple[str, tuple[Query, ...]], ...] = (
    ("Is the queue keeping up?", (
        Query("max by (queue) (pgworker_queue_oldest_job_age_seconds)",
              "How long the oldest due job has been waiting (database clock). The one number to "
              "alert on: it grows when workers are too few, stuck or down, whatever the cause."),
        Query('max by (queue) (pgworker_queue_jobs{state="due"})',
              "Backlog: jobs due now and waiting for a worker (what to scale and alert on). Jobs "
              "scheduled later (retries in backoff, delayed jobs) are `state=\"scheduled\"`, jobs "
              "behind an ordering key's head `blocked`."),
        Query('max by (queue) (deriv(pgworker_queue_jobs{state="due"}[15m]))',
              "Jobs per second by which the backlog grows (> 0) or shrinks (< 0)."),
        Query('max by (queue) (pgworker_queue_jobs{state="due"}) unless on (queue) '
              '(max by (queue) (pgworker_queue_paused) == 1)',
              "The backlog that workers can take: due jobs of queues that are not paused (as the "
              "Helm chart's KEDA trigger counts them, with the running jobs)."),
        Query('max by (queue) (pgworker_queue_jobs{state="scheduled"})',
              "Jobs waiting for their run_at: the work that falls due later."),
        Query('sum by (queue) (rate(pgworker_jobs_finished_total{outcome=~"succeeded|dead|cancelled"}[5m]))',
              "Throughput: jobs finished per second, all pods."),
        Query("histogram_quantile(0.95, sum by (queue, le) (rate(pgworker_job_wait_duration_seconds_bucket[5m])))",
              "95th percentile of the wait from due to claim."),
        Query("sum by (queue) (pgworker_jobs_in_flight)",
              "Jobs running or claimed right now; compare with the pods' total concurrency."),
    )),
    ("Which jobs die, and why?", (
        Query("sum by (queue, error_class) (increase(pgworker_jobs_dead_total[1h]))",
              "Jobs that went to dead in the last hour, by error class (the exception class or its "
              "code; `LEASE_EXPIRED`, `WORKER_DIED`, `TIMEOUT` are pgworker's own)."),
        Query('sum by (queue, task) (increase(pgworker_jobs_finished_total{outcome="dead"}[1h]))',
              "The same by task (attempts a worker settled as dead)."),
        Query("sum by (queue, error_class) (rate(pgworker_job_retries_total[5m]))",
              "Failed attempts that will be retried: the errors that are not fatal yet."),
        Query('max by (queue) (pgworker_queue_jobs{state="dead"})',
              "Dead jobs waiting for an operator; `pgworker dead list` shows them with their "
              "errors (error text never goes into a metric label)."),
        Query("max by (queue) (pgworker_queue_oldest_dead_job_age_seconds)",
              "How long the oldest dead job has been left unresolved."),
    )),
    ("Are leases being lost?", (
        Query("sum by (queue, action) (increase(pgworker_lease_expirations_total[15m]))",
              "Expired leases the reaper recovered: a worker crashed, was paused or was cut off "
              "from the database while it held a job."),
        Query("max by (queue) (pgworker_queue_expired_leases)",
              "Expired leases not reaped yet: > 0 for longer than the reap interval means no reaper "
              "runs (no pod is up, or the reaper fails)."),
        Query("sum by (queue, operation) (increase(pgworker_fenced_writes_total[15m]))",
              "Writes refused by the fencing token: a stale owner tried to act on a job another "
              "worker now holds. Each one is a duplicate execution the fence stopped from committing."),
        Query('sum by (queue, result) (rate(pgworker_lease_renewals_total{result!="renewed"}[5m]))',
              "Renewals refused (`lost`) or failed (`error`, the database was unreachable)."),
        Query('sum by (queue, task) (increase(pgworker_jobs_finished_total{outcome="lost"}[15m]))',
              "Attempts whose outcome was not written because the lease was gone."),
    )),
    ("Are the workers alive?", (
        Query("time() - min by (instance) (pgworker_claimer_heartbeat_timestamp_seconds)",
              "Seconds since the least recent claimer heartbeat of each pod; it stays near the "
              "poll interval, also during long jobs, unless a claimer is stuck."),
        Query("time() - max by (instance, loop) (pgworker_loop_last_success_timestamp_seconds)",
              "Seconds since each background loop of each pod (reaper, pruner, scheduler, renewer, "
              "settler, listener) completed a pass; compare with `pgworker_loop_interval_seconds`."),
        Query("(time() - max by (instance, claimer) (pgworker_claimer_loop_last_success_timestamp_seconds)) "
              "unless on (instance, claimer) (max by (instance, claimer) (pgworker_claimer_handler_running) > 0)",
              "Seconds since each claimer's loop went round, for the claimers that run no handler "
              "(about 1 s when idle; more means it waits on a claim, a write or a lock)."),
        Query('sum by (queue) (rate(pgworker_claims_total{result="error"}[5m]))',
              "Claims that failed (the database is unreachable, read-only, or refusing)."),
        Query("histogram_quantile(0.99, sum by (queue, le) (rate(pgworker_claim_duration_seconds_bucket[5m])))",
              "99th percentile latency of the claim statement."),
        Query("sum by (reason) (rate(pgworker_dispatcher_wakeups_total[5m]))",
              "What wakes the claimers: notify (LISTEN), poll (the fallback timer), sweep, reconnect."),
        Query("sum by (instance) (increase(pgworker_listener_reconnects_total[1h]))",
              "LISTEN connections lost and re-established (the fallback poll covers the gap)."),
    )),
    ("Is the statistics query healthy?", (
        Query("min by (instance) (pgworker_queue_stats_up)",
              "0 when the last statistics query failed (timed out, or the database is unreachable); "
              "the pgworker_queue_* gauges are then absent, not stale."),
        Query("max by (instance) (pgworker_queue_stats_duration_seconds)",
              "Time the statistics query took; close to `PGWORKER_STATS_TIMEOUT_SECONDS` "
              "means it is about to time out (a huge backlog, or a missing index)."),
        Query("min by (instance) (pgworker_table_stats_up)",
              "0 when the last jobs table health query failed (the pgworker_table_* gauges are then "
              "absent; the queue statistics do not depend on it)."),
    )),
    ("Is vacuum keeping up with the jobs table?", (
        Query("max by (job) (pgworker_table_dead_tuples)",
              "Dead row versions of the jobs table not removed yet. Falling back after each vacuum "
              "is health; still rising across vacuums means something holds the horizon back."),
        Query("min by (job) (pgworker_table_last_vacuum_age_seconds)",
              "Seconds since the jobs table was last vacuumed, by autovacuum or by hand (`+Inf`: "
              "never, since the statistics were reset)."),
        Query("max by (job, holder, holder_name, holder_state) (pgworker_table_horizon_age_seconds)",
              "How long the oldest snapshot has held the vacuum horizon back, and what holds it: a "
              "session (its application_name and state, such as `idle in transaction`), a "
              "replication slot or a prepared transaction."),
        Query("max by (job) (pgworker_table_horizon_lag_transactions)",
              "Transactions started since that snapshot: dead rows that any of them left cannot be "
              "removed until it goes."),
        Query("max by (job) (deriv(pgworker_table_size_bytes[1h]))",
              "Bytes per second by which the jobs table (with indexes and TOAST) grows; lasting "
              "growth with a steady backlog is bloat, or history that `pgworker prune` should remove."),
    )),
    ("Did the last drain run work? (Pushgateway)", (
        Query("time() - max by (schema) (pgworker_drain_last_run_timestamp_seconds)",
              "Seconds since the last drain run ended, whatever its result."),
        Query('max by (schema, result) (pgworker_drain_last_run_timestamp_seconds{result!="succeeded"})',
              "Present when the last run hit its deadline, was interrupted or failed."),
        Query("max by (schema) (pgworker_drain_jobs_left)",
              "Due jobs the last run left behind (it ran out of time)."),
    )),
)


def all_queries() -> list[str]:
    return [q.expr for _, queries in QUESTIONS for q in queries]

"""The one catalogue of pgworker's metrics and spans.

Every metric and span name is defined here once; ``metrics.py`` and ``tracing.py``
build from it, and ``docs/observability.md`` is generated from it
(``python -m pgworker.catalogue > docs/observability.md``; a test checks they agree).
Names follow Prometheus conventions (``pgworker_`` prefix, base units, ``_total`` for
counters) and the OpenTelemetry messaging semantic conventions (v1.44).
"""

from __future__ import annotations

from dataclasses import dataclass

# Bounded label values.
OUTCOMES = ("succeeded", "retried", "dead", "cancelled", "released", "snoozed", "lost")
CLAIM_RESULTS = ("claimed", "empty", "error")
RENEW_RESULTS = ("renewed", "lost", "error")
EXPIRATION_ACTIONS = ("requeued", "dead", "cancelled")
FENCED_OPERATIONS = ("renew", "complete", "fail", "release", "snooze", "cancel", "complete_in_transaction",
                     "step", "effect_started", "effect_done")
EFFECT_RECONCILE_RESULTS = ("happened", "not_happened")
WAKEUP_REASONS = ("notify", "poll", "reconnect", "sweep", "claim", "retry")
# pgworker_queue_jobs{state}: the live jobs of a queue, each in one of them. A pending
# job is due (run_at has come: claimable now, unless its queue is paused), scheduled
# (run_at later) or blocked (behind its ordering key's head).
STATS_STATES = ("due", "scheduled", "blocked", "running", "dead")
OUTCOME_WRITE_ERRORS = ("connection", "statement", "invalid_value")
PRUNED_STATES = ("succeeded", "cancelled", "dead")
DRAIN_RESULTS = ("succeeded", "deadline", "interrupted", "failed")
# The supervisor's background loops (pgworker_loop_*{loop}); the scheduler runs when the
# app has periodic jobs, the listener unless --no-listen, the pruner unless
# PGWORKER_PRUNE=false, the reaper, pruner, scheduler and listener not in drain mode. The
# label is not `service`: the Prometheus Operator's ServiceMonitor adds a target label of
# that name (the Kubernetes Service), which would rename ours to exported_service.
LOOPS = ("renewer", "settler", "listener", "reaper", "pruner", "scheduler", "registry")
# The task label of a job whose task this worker did not register (a typo, a rolling
# deploy, hostile input): one bounded value, not a series per unknown name.
UNREGISTERED_TASK = "unregistered"
ERROR_CLASS_TOP_N = 20
# Codes pgworker itself writes: their series exist from the start (and never count
# against the top-N of handler exception classes).
KNOWN_ERROR_CODES = ("LEASE_EXPIRED", "WORKER_DIED", "TIMEOUT", "UNKNOWN_TASK", "PAYLOAD_INVALID", "PERMANENT",
                     "EFFECT_UNCERTAIN")
OTHER = "other"
# The jobs table's health (pgworker_table_*): which vacuum, and what holds the horizon.
VACUUM_KINDS = ("manual", "auto")
HORIZON_HOLDERS = ("backend", "replication_slot", "prepared_transaction", "none")
HORIZON_LABELS = ("holder", "holder_name", "holder_state")
# holder_name and holder_state come from outside pgworker (an application_name, a slot or
# prepared transaction name): printable ASCII, at most this many characters.
HOLDER_LABEL_MAX_CHARS = 64

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    # "worker" (multiprocess, every process) | "database" (scrape-time query) | "supervisor"
    # (scrape-time, the supervisor's own state) | "drain"
    source: str
    multiprocess_mode: str | None = None
    buckets: tuple[float, ...] | None = None
    recorded_by: str = ""  # which processes record it (the docs' "source" column)


_STATS = "the supervisor, at scrape time (one cached query)"
_CLAIMERS = "claimers"
_DRAIN = "a `--drain` run, at exit"
_TABLE = "the supervisor, at scrape time (a second cached query, with the queue statistics)"
_LOOPS = "the supervisor, at scrape time (its services' and claimers' own clocks; no query)"

METRICS: tuple[MetricDef, ...] = (
    # read from PostgreSQL at scrape time, in the exporting process only
    MetricDef("pgworker_queue_jobs", "gauge", ("queue", "state"),
              "Jobs by queue and state, from the database: due (pending and due now: the backlog to "
              "scale and alert on), scheduled (pending, run_at later: retries in backoff, delayed jobs), "
              "blocked (pending behind its ordering key's head), running, dead.", "database",
              recorded_by=_STATS),
    MetricDef("pgworker_queue_oldest_job_age_seconds", "gauge", ("queue",),
              "Age of the oldest due, claimable job (database clock); 0 when none.", "database",
              recorded_by=_STATS),
    MetricDef("pgworker_queue_oldest_dead_job_age_seconds", "gauge", ("queue",),
              "Age of the oldest unresolved dead job; 0 when none.", "database", recorded_by=_STATS),
    MetricDef("pgworker_queue_expired_leases", "gauge", ("queue",),
              "Running jobs whose lease expired and that were not reaped yet.", "database", recorded_by=_STATS),
    MetricDef("pgworker_queue_dead_blocked_ordering_keys", "gauge", ("queue",),
              "Ordering keys held by a dead job (dead-head policy 'block'): their later jobs wait "
              "until it is replayed or discarded.", "database", recorded_by=_STATS),
    MetricDef("pgworker_queue_waiting_on_parents", "gauge", ("queue",),
              "Pending jobs waiting for parents (depends_on) that have not all succeeded yet; "
              "docs/graphs.md.", "database", recorded_by=_STATS),
    MetricDef("pgworker_queue_blocked_by_dead_parent_age_seconds", "gauge", ("queue",),
              "How long the job of the queue waiting longest behind a dead parent has waited since "
              "the parent died (held until the parent is replayed); 0 when none.", "database",
              recorded_by=_STATS),
    MetricDef("pgworker_queue_paused", "gauge", ("queue",),
              "1 while the queue is paused (nothing is claimed from it), else 0.", "database",
              recorded_by=_STATS),
    MetricDef("pgworker_queue_stats_up", "gauge", (),
              "1 when the last queue statistics query succeeded, else 0.", "database", recorded_by=_STATS),
    MetricDef("pgworker_queue_stats_duration_seconds", "gauge", (),
              "Time the last queue statistics query took.", "database", recorded_by=_STATS),
    # counted in every worker process (prometheus_client multiprocess mode)
    MetricDef("pgworker_claims_total", "counter", ("queue", "result"),
              "Claim statements by result (claimed, empty, error).", "worker", recorded_by=_CLAIMERS),
    MetricDef("pgworker_claimed_jobs_total", "counter", ("queue",),
              "Jobs handed out by claims.", "worker", recorded_by=_CLAIMERS),
    MetricDef("pgworker_claim_duration_seconds", "histogram", ("queue",),
              "Latency of the claim statement.", "worker", buckets=LATENCY_BUCKETS, recorded_by=_CLAIMERS),
    MetricDef("pgworker_job_wait_duration_seconds", "histogram", ("queue",),
              "From due (enqueue time, run_at or retry time) to claim, database clock.", "worker",
              buckets=WAIT_BUCKETS, recorded_by=_CLAIMERS),
    MetricDef("pgworker_job_unblock_wait_duration_seconds", "histogram", ("queue",),
              "Dependents only (depends_on), first attempt: from the later of the moment its last parent "
              "succeeded (jobs.unblocked_at, set by the trigger) and its run_at, to its claim, database clock. "
              "The claim latency a dependency adds; compare with pgworker_job_wait_duration_seconds.", "worker",
              buckets=WAIT_BUCKETS, recorded_by=_CLAIMERS),
    MetricDef("pgworker_job_run_duration_seconds", "histogram", ("queue", "task", "outcome"),
              "Handler run time by outcome.", "worker", buckets=RUN_BUCKETS, recorded_by=_CLAIMERS),
    MetricDef("pgworker_jobs_finished_total", "counter", ("queue", "task", "outcome"),
              "Attempts by outcome (succeeded, retried, dead, cancelled, released, snoozed, lost).", "worker",
              recorded_by="claimers; the supervisor for a claimer that died or timed out"),
    MetricDef("pgworker_job_retries_total", "counter", ("queue", "error_class"),
              "Failed attempts scheduled for a retry, by error class.", "worker",
              recorded_by="claimers; the supervisor (WORKER_DIED, TIMEOUT)"),
    MetricDef("pgworker_jobs_dead_total", "counter", ("queue", "error_class"),
              "Jobs moved to dead by a worker or the reaper, by error class.", "worker",
              recorded_by="claimers; the supervisor (WORKER_DIED, TIMEOUT); the reaper (LEASE_EXPIRED)"),
    MetricDef("pgworker_lease_renewals_total", "counter", ("queue", "result"),
              "Lease renewals by result: renewed; lost (refused by the fence, or presumed lost after a "
              "whole lease without an accepted renewal); skipped (its row was locked by another session: "
              "not waited for, tried again); error (the statement failed).", "worker",
              recorded_by="the supervisor (renewer, lease clock)"),
    MetricDef("pgworker_lease_expirations_total", "counter", ("queue", "action"),
              "Expired leases recovered by the reaper, by action (requeued, dead, cancelled).", "worker",
              recorded_by="the supervisor (reaper)"),
    MetricDef("pgworker_fenced_writes_total", "counter", ("queue", "operation"),
              "Writes refused by the fence because the lease was lost, by operation.", "worker",
              recorded_by="claimers (outcomes); the supervisor (renew, and a dead claimer's outcomes)"),
    MetricDef("pgworker_steps_skipped_total", "counter", ("queue",),
              "Durable steps and effects (ctx.step, ctx.effect) an attempt found recorded by an earlier "
              "one and did not run again (docs/effects.md).", "worker", recorded_by=_CLAIMERS),
    MetricDef("pgworker_effects_reconciled_total", "counter", ("queue", "result"),
              "External effects an earlier attempt started without recording their end, settled by the "
              "handler's reconcile function: happened (its result recorded, no second call) or "
              "not_happened (called again with the same idempotency key).", "worker", recorded_by=_CLAIMERS),
    MetricDef("pgworker_effects_uncertain_total", "counter", ("queue",),
              "External effects found started without an end and without a reconcile function: the job "
              "went dead EFFECT_UNCERTAIN for an operator to resolve (`pgworker effects resolve`).", "worker",
              recorded_by=_CLAIMERS),
    MetricDef("pgworker_lease_overrun_seconds", "histogram", ("queue",),
              "The duplicate-execution window: how long an attempt whose lease was lost ran past its "
              "lease's expiry, measured when its refused write reached the database (database clock).",
              "worker", buckets=WAIT_BUCKETS, recorded_by=_CLAIMERS),
    MetricDef("pgworker_jobs_in_flight", "gauge", ("queue",),
              "Jobs held by live claimers of this pod (running or about to run).", "worker",
              multiprocess_mode="livesum", recorded_by=_CLAIMERS),
    MetricDef("pgworker_claimer_heartbeat_timestamp_seconds", "gauge", (),
              "Oldest heartbeat among live claimers (Unix time): a claimer beats on every loop "
              "iteration and, while a handler runs, about once a second from its flusher thread.",
              "worker", multiprocess_mode="livemin", recorded_by=_CLAIMERS),
    MetricDef("pgworker_dispatcher_wakeups_total", "counter", ("reason",),
              "Work announced to the pod's claimers, by reason (notify, poll, reconnect, sweep, claim, retry: "
              "a drain run's retry the supervisor wrote, now due): each wakes at most one idle claimer.", "worker",
              recorded_by="the supervisor (listener, poll, a drain run's retries); claimers (a full claim)"),
    MetricDef("pgworker_listener_reconnects_total", "counter", (),
              "LISTEN connection re-established after a loss.", "worker",
              recorded_by="the supervisor (listener)"),
    MetricDef("pgworker_outcome_write_errors_total", "counter", ("cause",),
              "Failed outcome writes by cause: connection (lost; written after the reconnect), statement "
              "(refused for now: a timeout, a lock; written at the next flush), invalid_value (refused for "
              "its values: recorded as a failure OUTCOME_INVALID instead). A claimer that keeps failing "
              "makes /readyz fail.", "worker", recorded_by="claimers"),
    MetricDef("pgworker_reap_skipped_total", "counter", (),
              "Expired leases a reaper pass left for a later pass because another transaction held their "
              "ordering key's lock (maintenance never waits for a lock).", "worker",
              recorded_by="the supervisor (reaper)"),
    MetricDef("pgworker_reap_failed_total", "counter", ("queue",),
              "Expired leases whose row the reaper could not write (a CHECK constraint or trigger a user added "
              "refused it, a value out of range): each is logged with its job id and the error, noted in the "
              "job's error history (REAP_FAILED) when that can be written, and tried again 5 minutes later; "
              "the rest of its batch is reaped.", "worker", recorded_by="the supervisor (reaper)"),
    MetricDef("pgworker_jobs_pruned_total", "counter", ("outcome",),
              "Finished jobs deleted by the pruner once past their retention, by how they ended "
              "(succeeded, cancelled, dead).", "worker",
              recorded_by="the supervisor (pruner)"),
    MetricDef("pgworker_schedule_errors_total", "counter", (),
              "Failures to fire a periodic job's slot (each logged with the schedule's name and the fix); "
              "the other schedules still fire.", "worker", recorded_by="the supervisor (scheduler)"),
    MetricDef("pgworker_enqueued_jobs_total", "counter", ("queue",),
              "Jobs enqueued by this process (duplicates refused by a dedupe key excluded).", "worker",
              recorded_by="every process that enqueues"),
    MetricDef("pgworker_build_info", "gauge", ("version",),
              "Always 1; the version label is pgworker's.", "worker", multiprocess_mode="max",
              recorded_by="every process"),
    # the pod's loops, from the supervisor's own state at scrape time (pgworker/loop_gauges.py)
    MetricDef("pgworker_loop_last_success_timestamp_seconds", "gauge", ("loop",),
              "When the supervisor's background loop (a service: renewer, settler, listener, reaper, "
              "pruner, scheduler) last completed a pass (Unix time; its start until its first pass): "
              "a loop stuck on a hung statement or a lock, or failing every pass, falls behind.", "supervisor",
              recorded_by=_LOOPS),
    MetricDef("pgworker_loop_interval_seconds", "gauge", ("loop",),
              "The longest the healthy loop waits between two passes (its configured interval): "
              "the unit of the stall alert.", "supervisor", recorded_by=_LOOPS),
    MetricDef("pgworker_claimer_loop_last_success_timestamp_seconds", "gauge", ("claimer",),
              "When the claimer's loop last went round (a claim round, or a wake-up check while idle, "
              "about every second; Unix time; its start until then). It stands still while a handler "
              "runs (pgworker_claimer_handler_running).", "supervisor", recorded_by=_LOOPS),
    MetricDef("pgworker_claimer_handler_running", "gauge", ("claimer",),
              "1 while a handler runs in the claimer (its loop waits for it, as long as the handler's "
              "hard limit allows), else 0.", "supervisor", recorded_by=_LOOPS),
    # reported once at the end of a --drain run (pushed to a Pushgateway when configured)
    MetricDef("pgworker_drain_last_run_timestamp_seconds", "gauge", ("result",),
              f"When the last drain run ended (Unix time), by result ({', '.join(DRAIN_RESULTS)}).", "drain",
              recorded_by=_DRAIN),
    MetricDef("pgworker_drain_duration_seconds", "gauge", (),
              "How long the last drain run took (measured on the monotonic clock: a wall clock stepped "
              "back during the run does not shorten it).", "drain", recorded_by=_DRAIN),
    MetricDef("pgworker_drain_jobs_processed", "gauge", ("outcome",),
              "Attempts settled by the last drain run, by outcome.", "drain", recorded_by=_DRAIN),
    MetricDef("pgworker_drain_jobs_left", "gauge", (),
              "Due jobs left when the last drain run ended (non-zero after a deadline).", "drain",
              recorded_by=_DRAIN),
    # the jobs table's health, read from PostgreSQL at scrape time with the queue
    # statistics (sql/queries/health.sql; PostgreSQL docs, "Routine Vacuuming")
    MetricDef("pgworker_table_live_tuples", "gauge", (),
              "Live rows of the jobs table, as PostgreSQL's statistics estimate them "
              "(pg_stat_user_tables.n_live_tup).", "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_dead_tuples", "gauge", (),
              "Dead row versions of the jobs table not removed yet (pg_stat_user_tables.n_dead_tup, "
              "an estimate; after a vacuum, the dead rows it could not remove because a snapshot "
              "may still see them).", "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_last_vacuum_age_seconds", "gauge", ("vacuum",),
              "Seconds since the last vacuum of the jobs table finished, by vacuum (manual: a VACUUM "
              "command; auto: autovacuum), database clock; +Inf when never since the statistics "
              "were reset.", "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_size_bytes", "gauge", (),
              "Disk size of the jobs table with its indexes and TOAST (pg_total_relation_size).",
              "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_horizon_age_seconds", "gauge", HORIZON_LABELS,
              "How long the oldest holder of the jobs table's vacuum horizon has held it: a "
              "session's transaction age (xact_start) or a prepared transaction's; for a "
              "replication slot, or a session whose xact_start this role may not read, the time "
              "since this process first saw it hold the horizon at the same xid (a lower bound). "
              "Only the single oldest holder is exported; holder=\"none\" and 0 when nothing holds it.",
              "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_horizon_lag_transactions", "gauge", HORIZON_LABELS,
              "Transactions started since the xid at which the oldest holder holds the vacuum "
              "horizon (age() of its xmin): VACUUM cannot remove rows that any of them deleted "
              "or updated. Same single holder and labels as pgworker_table_horizon_age_seconds.",
              "database", recorded_by=_TABLE),
    MetricDef("pgworker_table_stats_up", "gauge", (),
              "1 when the last jobs table health query succeeded, else 0 (the other "
              "pgworker_table_* gauges are then absent, not stale).", "database", recorded_by=_TABLE),
)

METRICS_BY_NAME = {m.name: m for m in METRICS}


def exposed_names(metric: MetricDef) -> tuple[str, ...]:
    """The series names a metric exposes (histograms add _bucket, _sum, _count)."""
    if metric.kind == "histogram":
        return tuple(f"{metric.name}{s}" for s in ("_bucket", "_sum", "_count"))
    return (metric.name,)


def all_series_names() -> set[str]:
    return {n for m in METRICS for n in exposed_names(m)}


# ---- spans ----------------------------------------------------------------------------

MESSAGING_SYSTEM = "pgworker"


@dataclass(frozen=True)
class SpanDef:
    operation: str
    name: str  # with {queue}
    kind: str
    operation_type: str
    operation_names: tuple[str, ...]
    help: str


SPANS: tuple[SpanDef, ...] = (
    SpanDef("enqueue", "send {queue}", "PRODUCER", "send", ("send",),
            "One job enqueued; its W3C trace context is stored in the job row."),
    SpanDef("enqueue_many", "send {queue}", "CLIENT", "send", ("send",),
            "A bulk enqueue (messaging.batch.message_count jobs); each job carries this span's context."),
    SpanDef("claim", "receive {queue}", "CLIENT", "receive", ("claim",),
            "One claim statement, with the number of jobs it returned."),
    SpanDef("process", "process {queue}", "CONSUMER", "process", ("process",),
            "One attempt of a job, parented to the enqueuing span and linked to it."),
    SpanDef("settle", "settle {queue}", "CLIENT", "settle", ("complete", "fail", "retry", "release", "snooze", "cancel",
                                                     "complete_in_transaction"),
            "The fenced write of an attempt's outcome, with pgworker.fence.result (complete_in_transaction: "
            "the success written in the handler's own transaction, ctx.transaction()): a child of the "
            "attempt's process span when written alone or refused; one span per statement (with "
            "messaging.batch.message_count and a link to each attempt) when several are written together."),
    SpanDef("record", "record {queue}", "INTERNAL", "record", ("step", "effect_started", "effect_done"),
            "One fenced record of a durable step or external effect (ctx.step, ctx.effect), a child of the "
            "attempt's process span, with pgworker.step.name and pgworker.fence.result; a refusal is an "
            "error with a `fence refused` event."),
    SpanDef("renew", "renew {queue}", "CLIENT", "renew", ("renew",),
            "A batched lease renewal of the pod's live jobs of one queue."),
    SpanDef("reap", "reap {queue}", "INTERNAL", "reap", ("reap",),
            "Expired leases recovered by the reaper, with counts by action."),
)

SPAN_ATTRIBUTES = {
    "messaging.system": f"always {MESSAGING_SYSTEM!r}",
    "messaging.operation.type": "send, receive, process, settle (renew, reap and record are pgworker's own)",
    "messaging.operation.name": "send, claim, process, complete, fail, retry, release, snooze, cancel, complete_in_transaction, renew, "
                                "reap, step, effect_started, effect_done",
    "messaging.destination.name": "the queue",
    "messaging.message.id": "the job id (single-job spans)",
    "messaging.batch.message_count": "jobs in a batch (claim, bulk enqueue, batched settle, renew, reap)",
    "messaging.client.id": "the worker id (host:pid:claimer)",
    "error.type": "exception class of a failed attempt, or pgworker.LeaseLost for a fenced-out write",
    "pgworker.task": "the task name",
    "pgworker.job.attempt": "the attempt number (1-based)",
    "pgworker.lease.token": "the fencing token of the attempt",
    "pgworker.lease.overrun_seconds": "a refused write: how long the attempt ran past its lease's expiry",
    "pgworker.fence.result": "accepted, or refused when the lease was lost",
    "pgworker.step.name": "the name of a durable step or external effect (record spans)",
    "pgworker.outcome": "how the attempt ended (succeeded, retried, dead, ...)",
    "pgworker.link": "on a process span's links: enqueue (the job's own send span) or parent (a parent's "
                     "send context, for a job with depends_on)",
    "pgworker.parent_links.dropped": "a process span of a job with more than 127 traced parents: how many "
                                     "parents got no link (the first 127 to succeed do)",
}


if __name__ == "__main__":  # python -m pgworker.catalogue > docs/observability.md
    # The renderer reads this catalogue, so it is imported only here: run as a script,
    # this file is the module __main__, and pgworker.catalogue never imports the renderer.
    from pgworker.metrics_docs import render

    print(render(), end="")

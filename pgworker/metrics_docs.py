"""docs/observability.md, rendered from the catalogue (``pgworker.catalogue``).

``python -m pgworker.catalogue > docs/observability.md`` regenerates the file; a test
fails when the committed copy differs. Its PromQL comes from
:mod:`pgworker.metrics_questions`.
"""

from __future__ import annotations

from . import catalogue as cat
from . import config
from .metrics_questions import QUESTIONS
from .worker.health import SUPERVISION_STALL_SECONDS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _labels(m: cat.MetricDef) -> str:
    return ", ".join(f"`{label}`" for label in m.labels) or "none"


def _type(m: cat.MetricDef) -> str:
    if m.multiprocess_mode in ("livesum", "livemin"):
        return f"{m.kind} ({m.multiprocess_mode})"
    return m.kind


def _metric_table(source: str, prefix: str = "pgworker_") -> list[str]:
    out = ["| name | type | labels | meaning | recorded by |", "|---|---|---|---|---|"]
    for m in cat.METRICS:
        if m.source == source and m.name.startswith(prefix):
            out.append(f"| `{m.name}` | {_type(m)} | {_labels(m)} | {_cell(m.help)} | {_cell(m.recorded_by)} |")
    return out


def _values(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def render() -> str:
    """The whole of docs/observability.md."""
    lines: list[str] = [
        "# Observability",
        "",
        "<!-- Generated from pgworker/catalogue.py and pgworker/metrics_docs.py by",
        "     `python -m pgworker.catalogue > docs/observability.md`; do not edit by hand. -->",
        "",
        "pgworker exposes Prometheus metrics at `/metrics` (the supervisor of `pgworker run`,",
        f"port `--metrics-port`, default {config.METRICS_PORT}) and emits OpenTelemetry traces. Every",
        "name below is defined once, in `pgworker/catalogue.py`; the tests check that a running",
        "worker exposes each metric, that promtool accepts the exposition, and that the PromQL",
        "of the last section runs on a real Prometheus.",
        "",
        "Contents: [metrics from the database](#metrics-from-the-database),",
        "[metrics from the workers](#metrics-from-the-workers),",
        "[drain runs](#drain-runs-pushgateway), [label values](#label-values),",
        "[processes and multiprocess mode](#processes-and-multiprocess-mode),",
        "[health endpoints](#health-endpoints), [traces](#traces),",
        "[PromQL for the common questions](#promql-for-the-common-questions).",
        "",
        "## Metrics from the database",
        "",
        "Read by one query (`queue_stats` in `pgworker/sql/queries/reads.sql`) when `/metrics` is",
        "scraped, in the supervisor only, under a statement timeout",
        f"(`PGWORKER_STATS_TIMEOUT_SECONDS`, {_g(config.STATS_TIMEOUT_SECONDS)} s) and cached for",
        f"`PGWORKER_STATS_CACHE_SECONDS` ({_g(config.STATS_CACHE_SECONDS)} s), so that several scrapers or replicas do not load",
        "the database. Each figure comes from the partial index that covers it. `--no-stats`",
        "(`PGWORKER_STATS=false`) turns the query off, and these gauges with it: on a serverless",
        "compute that should suspend when idle, every periodic query keeps it awake. Every pod",
        "reports the same figures: aggregate them with `max`, not `sum`.",
        "",
        "Queue depth is `pgworker_queue_jobs{state=\"due\"}`: jobs whose run_at has come, the work",
        "waiting for a worker now (scale and alert on it, or on the oldest due job's age). Jobs",
        "scheduled later, retries in their backoff included, are `state=\"scheduled\"`: 10,000 jobs",
        "delayed by an hour make no backlog.",
        "",
        *_metric_table("database", "pgworker_queue_"),
        "",
        "### The jobs table's health",
        "",
        "A queue table is all updates and deletes, and VACUUM may only remove a dead row version",
        "once no snapshot can still see it (PostgreSQL docs, \"Routine Vacuuming\"). One old snapshot",
        "anywhere in the database (a session left `idle in transaction`, a long report, a",
        "replication slot fed by a standby's `hot_standby_feedback`, a forgotten prepared",
        "transaction) holds that horizon back for every table: dead rows pile up, and each claim",
        "walks more of them. These gauges show it before it hurts; the alerts",
        "`PgworkerJobsTableHorizonHeld`, `PgworkerJobsTableDeadTuplesNotReclaimed` and",
        "`PgworkerJobsTableNotVacuumed` watch them, and `PgworkerTableStatsDown` says when the",
        "gauges themselves are missing (docs/deploy.md, \"Alert runbook\"), and",
        "migration 0003 gives the table autovacuum settings for its churn (docs/deploy.md,",
        "\"Vacuum and the jobs table\").",
        "",
        "They are read by a second statement (`table_health` in `pgworker/sql/queries/health.sql`)",
        "in the same transaction as the queue statistics: the same timeout, the same cache, the",
        "same switch (`--no-stats`), and `pgworker_queue_stats_duration_seconds` covers both. It",
        "runs in a savepoint: when it fails, `pgworker_table_stats_up` is 0 and the other",
        "`pgworker_table_*` gauges are absent, while the queue gauges stay.",
        "",
        *_metric_table("database", "pgworker_table_"),
        "",
        "What holds the horizon: the single oldest of",
        "",
        "- the sessions of this database (`pg_stat_activity`: the older of `backend_xmin`, its",
        "  snapshot, and `backend_xid`, its own transaction once it wrote), and processes attached to",
        "  no database (a physical walsender carrying a standby's `hot_standby_feedback`), except a",
        "  running lazy VACUUM, whose xmin PostgreSQL ignores, and the statistics session itself;",
        "- replication slots by their `xmin` (`pg_replication_slots`; a slot's `catalog_xmin` holds",
        "  back the system catalogs only, not the jobs table);",
        "- prepared transactions of this database (`pg_prepared_xacts`).",
        "",
        "Only that one holder is exported, so the two horizon gauges have one series each: when",
        "the holder changes, the series with its labels is replaced by the new holder's. The",
        "labels are `holder` (what kind), `holder_name` (a session's `application_name`, or its",
        "backend type when it set none; a slot's name; a prepared transaction's gid) and",
        "`holder_state` (a session's state, such as `idle in transaction`; `active` or `inactive`",
        "for a slot; `prepared`). Names come from outside pgworker: they are cut to",
        f"{cat.HOLDER_LABEL_MAX_CHARS} printable ASCII characters (others become `?`). With nothing holding the",
        "horizon the gauges are 0 with `holder=\"none\"`. The session's pid is not a label",
        "(it would make a series per session); the runbook's query finds it.",
        "",
        "Privileges: `pg_stat_activity` shows every session's `application_name`, `backend_xmin`",
        "and `backend_xid` to any role, but the `state` and `xact_start` of another role's session",
        "only to that role and to members of `pg_read_all_stats` (or `pg_monitor`). Without them,",
        "`holder_state` is `unknown` and the age in seconds is the time since this supervisor first",
        "saw that session hold the horizon at the same xid (a lower bound, restarting with the",
        "supervisor), as it always is for a replication slot, which records no time. Granting",
        "`pg_read_all_stats` to the worker role also shows it every session's query text: weigh",
        "that before you do.",
        "",
        "## Metrics from the workers",
        "",
        "Counted where the event happens, in the claimer processes and the supervisor, and",
        "merged at scrape time (see [multiprocess mode](#processes-and-multiprocess-mode)).",
        "Known label sets start at 0 (every queue with every result, outcome, action,",
        "operation and reason; every registered task with every outcome; pgworker's own error",
        "codes), so `rate()` and `increase()` work from the first scrape.",
        "",
        *_metric_table("worker"),
        "",
        "What adds up to what:",
        "",
        "- `pgworker_jobs_finished_total` counts attempts whose worker reported an outcome. An",
        "  attempt whose worker vanished without one (a pod killed, paused or cut off) shows",
        "  up in `pgworker_lease_expirations_total` instead; if its worker comes back late, its",
        "  refused write is counted as `lost` and in `pgworker_fenced_writes_total`.",
        "- `pgworker_jobs_dead_total` counts every move to dead, by workers and the reaper alike",
        "  (`LEASE_EXPIRED`): it is the dead-job count to alert on. Its sum over `error_class`",
        "  equals `pgworker_jobs_finished_total{outcome=\"dead\"}` plus",
        "  `pgworker_lease_expirations_total{action=\"dead\"}`.",
        "- `pgworker_job_retries_total` equals `pgworker_jobs_finished_total{outcome=\"retried\"}`",
        "  by queue; expired leases put back to pending are `pgworker_lease_expirations_total{action=\"requeued\"}`.",
        "- `pgworker_job_run_duration_seconds` observes the handler's run time once per",
        "  attempt, labelled with the outcome the fence confirmed (`lost` when refused).",
        "- `pgworker_job_wait_duration_seconds` is measured by the claim statement itself",
        "  (`now() - run_at`, database clock), so worker clock skew does not enter it.",
        "",
        "## Drain runs (Pushgateway)",
        "",
        "A `pgworker run --drain` is over before a scrape would find it. At exit it prints one",
        "JSON line on stdout (`{\"event\": \"drain_summary\", \"result\", \"processed\",",
        "\"succeeded\", \"retried\", \"dead\", \"cancelled\", \"released\", \"snoozed\", \"lost\",",
        "\"left\", \"next_due_seconds\", \"duration_seconds\"}`: `left` counts the jobs due at",
        "exit, `next_due_seconds` says when the earliest job not due yet falls due, null when",
        "none waits) and, with `--pushgateway-url`, pushes these gauges to",
        "the Pushgateway under the grouping key `job=\"pgworker_drain\"`, `schema=\"<schema>\"`,",
        "replacing the previous run's group. Scrape the Pushgateway with `honor_labels: true`.",
        "A failed push is logged and does not change the exit code.",
        "",
        *_metric_table("drain"),
        "",
        "## Label values",
        "",
        "Labels are bounded: never a job id, worker id, pid or error text.",
        "",
        "| label | values |",
        "|---|---|",
        "| `queue` | the worker's queues (`--queues`, else the queues of the app's tasks) |",
        "| `task` | registered task names; `PGWORKER_METRICS_TASK_LABEL=false` sets it to `\"\"` everywhere |",
        f"| `outcome` | {_values(cat.OUTCOMES)} |",
        f"| `result` (claims) | {_values(cat.CLAIM_RESULTS)} |",
        f"| `result` (renewals) | {_values(cat.RENEW_RESULTS)} |",
        f"| `action` | {_values(cat.EXPIRATION_ACTIONS)} |",
        f"| `operation` | {_values(cat.FENCED_OPERATIONS)} |",
        f"| `reason` | {_values(cat.WAKEUP_REASONS)} |",
        f"| `state` | {_values(cat.STATS_STATES)}: a pending job is `due` (its run_at has come), `scheduled` (run_at later) or `blocked` (behind its ordering key's head), never `pending`; finished states are counted by the counters, not the database |",
        f"| `error_class` | the stored error code: an exception's `pgworker_code`, else its class name (module-qualified outside builtins); pgworker's own codes ({_values(cat.KNOWN_ERROR_CODES)}) always; past the first {cat.ERROR_CLASS_TOP_N} other classes a process sees, `{cat.OTHER}` |",
        "| `version` | pgworker's version |",
        f"| `vacuum` | {_values(cat.VACUUM_KINDS)} |",
        f"| `holder` | {_values(cat.HORIZON_HOLDERS)} |",
        f"| `holder_name`, `holder_state` | the single oldest horizon holder's name and state (see [the jobs table's health](#the-jobs-tables-health)): printable ASCII, at most {cat.HOLDER_LABEL_MAX_CHARS} characters, one value at a time |",
        "",
        "## Processes and multiprocess mode",
        "",
        "`pgworker run` is a supervisor and `--concurrency` claimer processes. All of them count",
        "into prometheus_client's multiprocess mode:",
        "",
        "- `pgworker run` gives each run a fresh `PROMETHEUS_MULTIPROC_DIR` (a temporary",
        "  directory, or `--metrics-dir` wiped of `*.db` files) before anything imports",
        "  prometheus_client, which reads the variable at import. Claimers inherit it.",
        "- Each process writes its values to mmap files of its own; `/metrics` merges them.",
        "  Counters and histograms of a claimer that exits, even by `kill -9`, stay counted,",
        "  so totals never drop when a claimer dies or is recycled.",
        "- When a claimer exits the supervisor calls `mark_process_dead(pid)`, which removes its",
        "  live gauges: `pgworker_jobs_in_flight` (`livesum`: the sum over live claimers) and",
        "  `pgworker_claimer_heartbeat_timestamp_seconds` (`livemin`: the oldest beat among live",
        "  claimers; only claimers create it, so the supervisor never reports a 0). It then merges",
        "  the claimer's counters, histograms and `max` gauges into one compacted file per kind",
        "  (`counter_compacted.db`, ...) with prometheus_client's own merge, and removes its files,",
        "  under the lock the scrape takes: every total is the same before and after, and the",
        "  directory holds the live processes' files plus at most three, however often",
        "  `--max-jobs-per-child` recycles the claimers (`pgworker/metrics_files.py`).",
        "- Custom collectors do not work in children: the queue statistics are collected by the",
        "  supervisor's HTTP server at scrape time.",
        "- Outside `pgworker run` (your web process enqueueing) the same metrics live in",
        "  prometheus_client's default registry; serve it as your application already does.",
        "  One-shot commands (`pgworker enqueue`, `status`, ...) keep metrics in memory.",
        "- Cost: an event is one or two updates of an mmap'd value (a histogram observation",
        "  is two: its sum and one bucket); labelled children are cached. A job costs five",
        "  (its wait, its outcome, its run time), a claim statement five (result, latency,",
        "  jobs, in-flight), a batch of outcome writes one per queue (in-flight).",
        "",
        "## Health endpoints",
        "",
        "Served by the supervisor next to `/metrics` (none in drain mode).",
        "",
        "| path | 200 when | never |",
        "|---|---|---|",
        f"| `/healthz` | the supervisor's loop ticked within the last {_g(SUPERVISION_STALL_SECONDS)} s | touches the database: a database outage must not get the pod restarted |",
        "| `/readyz` | connected to PostgreSQL and writable, the schema is at this pgworker's version, the LISTEN connection is up (unless `--no-listen`), and every claimer can write its jobs' outcomes (none has failed to for 10 s); 503 with the reason otherwise, and from the start of a shutdown | runs a query: it reads flags the supervisor's services and the claimers keep |",
        "",
        "## Traces",
        "",
        "Span names and attributes follow the OpenTelemetry messaging semantic conventions",
        "(v1.44, status Development).",
        "",
        "| operation | span name | kind | `messaging.operation.type` | `messaging.operation.name` | what it covers |",
        "|---|---|---|---|---|---|",
    ]
    for s in cat.SPANS:
        lines.append(f"| {s.operation} | `{s.name}` | {s.kind} | `{s.operation_type}` | "
                     f"{_values(s.operation_names)} | {_cell(s.help)} |")
    lines += [
        "",
        "| attribute | value |",
        "|---|---|",
    ]
    for name, meaning in cat.SPAN_ATTRIBUTES.items():
        lines.append(f"| `{name}` | {_cell(meaning)} |")
    lines += [
        "",
        "One job is one trace, from the request that enqueued it to its last attempt:",
        "",
        "```",
        "<your request span>",
        "└─ send {queue}                      PRODUCER; its W3C context is stored in jobs.trace_context",
        "   ├─ process {queue}  attempt 1     CONSUMER; parent: the send span (and a link to it)",
        "   │  ├─ <your handler's spans, SQL spans with --trace-sql>",
        "   │  └─ settle {queue} retry        pgworker.fence.result = accepted",
        "   └─ process {queue}  attempt 2",
        "      └─ settle {queue} complete     (refused: error.type = pgworker.LeaseLost)",
        "```",
        "",
        "- Parenting: the process span's parent is the enqueuing span (a documented choice:",
        "  one trace per job), and it also links to it, as the conventions suggest for",
        "  consumers. A job enqueued by a handler continues the trace of that handler's job.",
        "- `receive {queue}` (one per claim statement) and `renew`/`reap` spans are roots of",
        "  their own: one claim, renewal or reap serves many jobs of many traces.",
        "- `settle {queue}`: outcomes are written in batches (one fenced statement per kind per",
        "  flush). An outcome written alone (the usual case for jobs that run longer than a",
        "  moment) gets a settle span that is a child of its attempt's process span, as drawn",
        "  above. When one statement writes several outcomes, it gets one settle span, a root",
        "  with `messaging.batch.message_count` and a link to each sampled attempt's process",
        "  span, as the messaging conventions do for batch operations: a span per attempt would",
        "  double what tracing costs a busy worker (the Python SDK spends tens of microseconds",
        "  of CPU on each span; see the README's benchmark). A write the fence refuses is always",
        "  traced on its own, as an error child of its attempt's process span",
        "  (`pgworker.fence.result = refused`, `error.type = pgworker.LeaseLost`). Settle spans",
        "  start when the write started. A batch of more than 128 attempts (the SDK's default",
        "  link limit) is split over several spans, so no link is dropped.",
        "- Setup: each process (the supervisor, every claimer, and `pgworker enqueue`, a traced",
        "  producer like the library) builds its own SDK tracer provider from the standard",
        "  variables (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME`,",
        "  `OTEL_TRACES_SAMPLER`, `OTEL_RESOURCE_ATTRIBUTES`) and flushes it before it exits",
        "  (`pgworker enqueue`'s console exporter writes to stderr: stdout is the job id).",
        "  `otlp` needs `pip install 'pgworker[otlp]'`. When those variables",
        "  configure no exporter, a tracer provider your app module installs globally is used.",
        "- Off: with no exporter configured, or with `--no-tracing` (`PGWORKER_TRACING=false`),",
        "  no span is built: each tracing call returns at once.",
        "- Volume: an attempt makes one span (process), and a settle span when its outcome is",
        "  written alone; a claim and a batched write make one each. At",
        "  thousands of jobs a second an exporter can fall behind and the SDK's batch processor",
        "  drops spans (it logs `Queue full, dropping Span`): sample",
        "  (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`) or",
        "  raise `OTEL_BSP_MAX_QUEUE_SIZE`.",
        "- `--trace-sql` (`PGWORKER_TRACE_SQL=true`) turns on opentelemetry-instrumentation-psycopg",
        "  in the claimers: a claim's SQL is a child of its receive span, a handler's of its",
        "  process span; batched outcome writes appear as spans of their own. The",
        "  instrumentation names spans after the first SQL word (a claim shows as `WITH`).",
        "- Exception messages and tracebacks are never recorded in spans (they may carry",
        "  secrets): `error.type` carries the class or code only. The job's errors in the",
        "  database keep the message, bounded and redacted; the worker log prints each failed",
        "  attempt's message and, on the lines after it, where the handler raised (its frames",
        "  as Python prints them, without the message; the JSON log format puts them in",
        "  `traceback`).",
        "",
        "## PromQL for the common questions",
        "",
    ]
    for question, queries in QUESTIONS:
        lines += [f"### {question}", ""]
        for q in queries:
            lines += ["```promql", q.expr, "```", "", q.meaning, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _g(seconds: float) -> str:
    return f"{seconds:g}"

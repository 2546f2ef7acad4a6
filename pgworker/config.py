"""Settings from arguments and ``PGWORKER_*`` environment variables.

Every setting has a default (a constant with its unit in the name), an environment
variable, and a validation step run at construction, so a bad value is reported at
start-up with the name of the setting to fix rather than as a failure at 3 a.m.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .errors import ConfigError
from .names import DEFAULT_SCHEMA as DEFAULT_SCHEMA  # the setting's default; defined beside the name rules
from .names import check_queue_name, check_schema_name, redact_dsn

DEFAULT_QUEUE = "default"
LEASE_SECONDS = 60.0
POLL_INTERVAL_SECONDS = 2.0
REAP_INTERVAL_SECONDS = 15.0
MAX_RUNTIME_SECONDS = 3600.0
SHUTDOWN_GRACE_SECONDS = 30.0
MAX_BATCH_SIZE = 100
MAX_PAYLOAD_BYTES = 1024 * 1024
ERROR_HISTORY_ENTRIES = 10
ERROR_MESSAGE_MAX_CHARS = 1000
RESULT_MAX_BYTES = 64 * 1024
MAX_PARENTS = 1000
METRICS_PORT = 9186
STATS_CACHE_SECONDS = 5.0
STATS_TIMEOUT_SECONDS = 2.0
COMPLETION_FLUSH_SECONDS = 0.05
STATEMENT_TIMEOUT_SECONDS = 30.0
LOCK_TIMEOUT_SECONDS = 5.0
PRUNE_INTERVAL_SECONDS = 60.0
CLAIM_FLOOR_RESET_SECONDS = 10.0
RETENTION_SUCCEEDED_SECONDS = 86400.0
RETENTION_CANCELLED_SECONDS = 7 * 86400.0
RETENTION_QUEUE_EVENTS_SECONDS = 90 * 86400.0
#: The most claimer processes one pod runs (each holds a connection and a process).
MAX_CONCURRENCY = 1024
#: The longest duration a setting may hold: 100 years (retention included).
MAX_SETTING_SECONDS = 100 * 365 * 86400
#: statement_timeout and lock_timeout are integers of milliseconds in PostgreSQL
#: (PostgreSQL docs, 20.11 "Client Connection Defaults": at most INT_MAX ms, 24.8 days).
MAX_TIMEOUT_SECONDS = 2_147_483
_MILLISECOND_SETTINGS = ("statement_timeout_seconds", "lock_timeout_seconds", "stats_timeout_seconds")


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {v!r}")


def _queues(v: str) -> tuple[str, ...]:
    """'emails, reports' -> ('emails', 'reports'); '' (or blanks) -> (): not set. Raises
    ValueError for separators without a name (',': a trial's run fell back to every queue)."""
    names = tuple(q.strip() for q in v.split(",") if q.strip())
    if not names and v.strip():
        raise ValueError(f"{v!r} names no queue: give names separated by commas, e.g. emails,reports "
                         "(or nothing, for the app's queues)")
    return names


def _queue_counts(v: str) -> tuple[tuple[str, int], ...]:
    """'emails=2,reports=1' -> (('emails', 2), ('reports', 1))."""
    out = []
    for part in (p.strip() for p in v.split(",")):
        if not part:
            continue
        name, sep, count = part.partition("=")
        if not sep:
            raise ValueError(f"expected QUEUE=COUNT items separated by commas, got {part!r}")
        out.append((name.strip(), int(count)))
    return tuple(out)


def _opt_int(v: str) -> int | None:
    return None if v.strip().lower() in ("", "auto") else int(v)


def _opt_float(v: str) -> float | None:
    return None if v.strip().lower() in ("", "none", "off") else float(v)


def _env(name: str, parse: Any = str, *, help: str, unit: str | None = None,
         default_text: str | None = None) -> dict[str, Any]:
    """A field's metadata: its environment variable and parser, and for the reference
    (docs/configuration.md, ``python -m pgworker.settings_docs``) its ``help`` (one
    sentence or two), ``unit`` (for numbers whose name does not end in ``_seconds`` or
    ``_bytes``) and ``default_text`` (for a default that is not a plain value)."""
    return {"env": name, "parse": parse, "help": help, "unit": unit, "default_text": default_text}


@dataclass(frozen=True)
class Settings:
    """Worker and client settings. Durations are in seconds, sizes in bytes.

    Build with :meth:`from_env` to read ``PGWORKER_*`` variables; keyword overrides win
    over the environment. Raises :class:`ConfigError` naming the setting to fix. Each
    field's meaning is in its metadata (``help``), rendered in docs/configuration.md.
    """

    dsn: str | None = field(default=None, metadata=_env(
        "PGWORKER_DSN", unit="libpq DSN", default_text="none: required by every command that uses the database",
        help="libpq connection string or URL for enqueues, claims and outcomes (may be a pooler)."))
    listen_dsn: str | None = field(default=None, metadata=_env(
        "PGWORKER_LISTEN_DSN", unit="libpq DSN", default_text="the DSN",
        help="Direct (non-pooled) connection for LISTEN, when the DSN is a transaction pooler."))
    schema: str = field(default=DEFAULT_SCHEMA, metadata=_env(
        "PGWORKER_SCHEMA", unit="name",
        help="PostgreSQL schema of pgworker's tables; apps sharing a database each take their own."))
    queues: tuple[str, ...] = field(default=(), metadata=_env(
        "PGWORKER_QUEUES", _queues, unit="comma-separated names",
        default_text="the queues of the registered tasks, and `default`",
        help="Queues this worker claims from."))
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1,
                             metadata=_env("PGWORKER_CONCURRENCY", int, unit="processes",
                                           default_text="the CPU count",
                                           help="Claimer processes of `pgworker run`."))
    lease_seconds: float = field(default=LEASE_SECONDS, metadata=_env(
        "PGWORKER_LEASE_SECONDS", float,
        help="How long a claim owns a job; renewed while its claimer lives, then recovered by the reaper."))
    renew_interval_seconds: float | None = field(default=None, metadata=_env(
        "PGWORKER_RENEW_INTERVAL_SECONDS", _opt_float, default_text="a third of the lease",
        help="How often live leases are renewed; at most half the lease."))
    max_runtime_seconds: float = field(default=MAX_RUNTIME_SECONDS, metadata=_env(
        "PGWORKER_MAX_RUNTIME_SECONDS", float,
        help="Age past which an attempt's lease is no longer renewed (a task's `max_runtime` wins)."))
    poll_interval_seconds: float = field(default=POLL_INTERVAL_SECONDS, metadata=_env(
        "PGWORKER_POLL_INTERVAL_SECONDS", float,
        help="Fallback poll: idle claimers look for due work this often, NOTIFY or not."))
    listen: bool = field(default=True, metadata=_env(
        "PGWORKER_LISTEN", _bool,
        help="LISTEN for enqueue notifications (off: the fallback poll alone wakes claimers)."))
    reap_interval_seconds: float = field(default=REAP_INTERVAL_SECONDS, metadata=_env(
        "PGWORKER_REAP_INTERVAL_SECONDS", float, help="How often the reaper recovers expired leases."))
    shutdown_grace_seconds: float = field(default=SHUTDOWN_GRACE_SECONDS, metadata=_env(
        "PGWORKER_SHUTDOWN_GRACE_SECONDS", float,
        help="Time running jobs get to finish at shutdown (SIGTERM, end of a drain); jobs not started are "
             "released at once, and one still running at the end fails SHUTDOWN (the attempt counts, due again "
             "at once)."))
    batch_size: int | None = field(default=None, metadata=_env(
        "PGWORKER_BATCH_SIZE", _opt_int, unit="jobs", default_text="automatic (`auto`)",
        help="Jobs per claim; automatic sizes batches from measured run times."))
    max_batch_size: int = field(default=MAX_BATCH_SIZE, metadata=_env(
        "PGWORKER_MAX_BATCH_SIZE", int, unit="jobs", help="Largest batch a claim takes (1-10000)."))
    max_payload_bytes: int = field(default=MAX_PAYLOAD_BYTES, metadata=_env(
        "PGWORKER_MAX_PAYLOAD_BYTES", int, help="Largest payload accepted at enqueue, as UTF-8 JSON "
        "(nested at most 500 levels deep, a fixed limit: pgworker.jobspec.MAX_PAYLOAD_DEPTH)."))
    error_history_entries: int = field(default=ERROR_HISTORY_ENTRIES, metadata=_env(
        "PGWORKER_ERROR_HISTORY_ENTRIES", int, unit="attempts",
        help="Failed attempts kept in a job's error history (1-1000); older ones are dropped."))
    error_message_max_chars: int = field(default=ERROR_MESSAGE_MAX_CHARS, metadata=_env(
        "PGWORKER_ERROR_MESSAGE_MAX_CHARS", int, unit="characters",
        help="Longest error message stored per attempt (20-100000); longer ones are cut."))
    step_max_per_job: int = field(default=1000, metadata=_env(
        "PGWORKER_STEP_MAX_PER_JOB", int, unit="records",
        help="Most durable steps and effects (ctx.step, ctx.effect) one job may record (1-100000); "
             "one more fails the attempt STEP_LIMIT."))
    step_result_max_bytes: int = field(default=65536, metadata=_env(
        "PGWORKER_STEP_RESULT_MAX_BYTES", int, unit="bytes",
        help="Largest JSON result of one step or effect (16-10485760, as UTF-8 JSON text); a larger one "
             "fails the attempt STEP_RESULT_TOO_LARGE."))
    result_max_bytes: int = field(default=RESULT_MAX_BYTES, metadata=_env(
        "PGWORKER_RESULT_MAX_BYTES", int, unit="bytes",
        help="Largest handler return value stored as the job's result, as UTF-8 JSON (2-100000000); "
             "a larger one fails the attempt with RESULT_TOO_LARGE."))
    max_parents: int = field(default=MAX_PARENTS, metadata=_env(
        "PGWORKER_MAX_PARENTS", int, unit="jobs",
        help="Most jobs one job may depend on (depends_on), 1-100000; more is refused at enqueue."))
    metrics_port: int = field(default=METRICS_PORT, metadata=_env(
        "PGWORKER_METRICS_PORT", int, unit="TCP port",
        help="Port of /metrics, /healthz and /readyz of `pgworker run`; 0 turns the HTTP server off."))
    metrics_host: str = field(default="0.0.0.0", metadata=_env(
        "PGWORKER_METRICS_HOST", unit="address", help="Address the metrics server binds to (0.0.0.0: every interface)."))
    stats: bool = field(default=True, metadata=_env(
        "PGWORKER_STATS", _bool,
        help="Query queue statistics from PostgreSQL at scrape time (keeps a suspending compute awake)."))
    stats_cache_seconds: float = field(default=STATS_CACHE_SECONDS, metadata=_env(
        "PGWORKER_STATS_CACHE_SECONDS", float, help="How long scrapes reuse the last queue statistics."))
    stats_timeout_seconds: float = field(default=STATS_TIMEOUT_SECONDS, metadata=_env(
        "PGWORKER_STATS_TIMEOUT_SECONDS", float,
        help="Connect and statement timeout of the statistics query at scrape time."))
    metrics_task_label: bool = field(default=True, metadata=_env(
        "PGWORKER_METRICS_TASK_LABEL", _bool, help="Label job metrics with the task (off: fewer series)."))
    tracing: bool = field(default=True, metadata=_env(
        "PGWORKER_TRACING", _bool,
        help="OpenTelemetry spans, exported as the `OTEL_*` variables say (off: no span is built)."))
    trace_sql: bool = field(default=False, metadata=_env(
        "PGWORKER_TRACE_SQL", _bool,
        help="Instrument psycopg for SQL child spans (opentelemetry-instrumentation-psycopg)."))
    prepared_statements: bool = field(default=True, metadata=_env(
        "PGWORKER_PREPARED_STATEMENTS", _bool,
        help="Server-side prepared statements; turn off behind pgbouncer older than 1.21 in transaction mode."))
    synchronous_commit: str | None = field(default=None, metadata=_env(
        "PGWORKER_SYNCHRONOUS_COMMIT", unit="on, off, local, remote_write or remote_apply",
        default_text="the server's",
        help="`synchronous_commit` of the claimers' sessions (claims and outcomes), an opt-in; "
             "see the README's Durability."))
    completion_flush_seconds: float = field(default=COMPLETION_FLUSH_SECONDS, metadata=_env(
        "PGWORKER_COMPLETION_FLUSH_SECONDS", float,
        help="Longest time a finished job's outcome waits to be written in one batch with others."))
    max_jobs_per_child: int | None = field(default=None, metadata=_env(
        "PGWORKER_MAX_JOBS_PER_CHILD", _opt_int, unit="jobs", default_text="never",
        help="Recycle a claimer process after this many jobs."))
    max_memory_per_child_bytes: int | None = field(default=None, metadata=_env(
        "PGWORKER_MAX_MEMORY_PER_CHILD_BYTES", _opt_int, default_text="never",
        help="Recycle a claimer process whose resident memory is above this."))
    worker_id: str | None = field(default=None, metadata=_env(
        "PGWORKER_WORKER_ID", unit="text", default_text="host:pid",
        help="This worker's identity in leases (`lease_owner`) and spans (`messaging.client.id`)."))
    priority_aging_seconds: float | None = field(default=None, metadata=_env(
        "PGWORKER_PRIORITY_AGING_SECONDS", _opt_float, default_text="off: strict priority",
        help="Priority aging: a job due for longer than this is claimed before higher-priority work "
             "(docs/scheduling.md); a queue's own bound (`pgworker queue set --aging`) wins."))
    claim_floor_reset_seconds: float = field(default=CLAIM_FLOOR_RESET_SECONDS, metadata=_env(
        "PGWORKER_CLAIM_FLOOR_RESET_SECONDS", float,
        help="How often a claimer forgets where its claims start (its floors, docs/architecture.md): the "
             "longest a job another session locked and released unchanged (an operator's SELECT ... FOR "
             "UPDATE) may be passed over; lower it if tools of yours do that often; 0 starts every claim "
             "from the start of its queue's range (exact, slower while an old snapshot is held)."))
    queue_concurrency: tuple[tuple[str, int], ...] = field(default=(), metadata=_env(
        "PGWORKER_QUEUE_CONCURRENCY", _queue_counts, unit="QUEUE=N, comma-separated", default_text="none",
        help="Per-pod limits: at most N jobs of a queue held at once by this pod's claimers ('emails=2,reports=1')."))
    schedules: bool = field(default=True, metadata=_env(
        "PGWORKER_SCHEDULES", _bool, help="Whether this worker enqueues the app's periodic jobs (its scheduler service)."))
    statement_timeout_seconds: float = field(default=STATEMENT_TIMEOUT_SECONDS, metadata=_env(
        "PGWORKER_STATEMENT_TIMEOUT_SECONDS", float,
        help="`statement_timeout` of every worker session: no statement of a claimer or a service runs longer "
             "(set it on the role behind a transaction pooler)."))
    lock_timeout_seconds: float = field(default=LOCK_TIMEOUT_SECONDS, metadata=_env(
        "PGWORKER_LOCK_TIMEOUT_SECONDS", float,
        help="`lock_timeout` of every worker session and of the App's pooled connections (producers, operator "
             "commands, the console): no statement waits longer for a lock (it fails with DatabaseBusy); "
             "maintenance never waits at all (it skips a locked ordering key)."))
    prune: bool = field(default=True, metadata=_env(
        "PGWORKER_PRUNE", _bool,
        help="Delete finished jobs past their retention (every prune interval; once at the start of a drain run)."))
    prune_interval_seconds: float = field(default=PRUNE_INTERVAL_SECONDS, metadata=_env(
        "PGWORKER_PRUNE_INTERVAL_SECONDS", float, help="How often the pruner deletes what is past its retention."))
    retention_succeeded_seconds: float | None = field(default=RETENTION_SUCCEEDED_SECONDS, metadata=_env(
        "PGWORKER_RETENTION_SUCCEEDED_SECONDS", _opt_float,
        help="How long succeeded jobs are kept after they finished (`off`: kept for good)."))
    retention_cancelled_seconds: float | None = field(default=RETENTION_CANCELLED_SECONDS, metadata=_env(
        "PGWORKER_RETENTION_CANCELLED_SECONDS", _opt_float,
        help="How long cancelled jobs are kept after they finished (`off`: kept for good)."))
    retention_dead_seconds: float | None = field(default=None, metadata=_env(
        "PGWORKER_RETENTION_DEAD_SECONDS", _opt_float, default_text="off: kept until replayed or discarded",
        help="How long dead jobs are kept after they died."))
    retention_queue_events_seconds: float | None = field(default=RETENTION_QUEUE_EVENTS_SECONDS, metadata=_env(
        "PGWORKER_RETENTION_QUEUE_EVENTS_SECONDS", _opt_float,
        help="How long the queues' audit trail (pause, resume, configure, delete) is kept (`off`: for good)."))

    def __post_init__(self) -> None:
        check_schema_name(self.schema)
        if isinstance(self.queues, str):  # queues="emails" was six queues, e, m, a, i, l and s (a review)
            try:
                object.__setattr__(self, "queues", _queues(self.queues))
            except ValueError as exc:
                raise ConfigError(f"queues {exc}") from None
        elif not isinstance(self.queues, tuple):
            if not isinstance(self.queues, (list, set, frozenset)) or not all(isinstance(q, str) for q in self.queues):
                raise ConfigError(f"queues takes names as a tuple or list of strings (or one comma-separated "
                                  f"string), got {self.queues!r}")
            queues = sorted(self.queues) if isinstance(self.queues, (set, frozenset)) else self.queues
            object.__setattr__(self, "queues", tuple(queues))
        for q in self.queues:
            check_queue_name(q)
        self._check_seconds()
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"concurrency must be between 1 and {MAX_CONCURRENCY} claimer processes, got "
                              f"{self.concurrency}; set --concurrency or PGWORKER_CONCURRENCY (for more, run more pods)")
        for name in ("max_jobs_per_child", "max_memory_per_child_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be >= 1, or unset for no limit; got {value}; set PGWORKER_{name.upper()}")
        if self.lease_seconds < 1:
            raise ConfigError(f"lease_seconds must be >= 1, got {self.lease_seconds}; set PGWORKER_LEASE_SECONDS")
        renew = self.effective_renew_interval
        if renew <= 0 or self.lease_seconds < 2 * renew:
            raise ConfigError(
                f"the lease ({self.lease_seconds} s) must be at least two renewal intervals ({renew} s): "
                "a single late renewal would otherwise lose the lease; lower PGWORKER_RENEW_INTERVAL_SECONDS")
        if self.max_runtime_seconds <= 0:
            raise ConfigError(f"max_runtime_seconds must be > 0, got {self.max_runtime_seconds}; set PGWORKER_MAX_RUNTIME_SECONDS")
        for name in ("poll_interval_seconds", "reap_interval_seconds", "stats_cache_seconds",
                     "stats_timeout_seconds", "completion_flush_seconds", "statement_timeout_seconds",
                     "lock_timeout_seconds", "prune_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}; set {_variable(name)}")
        if self.shutdown_grace_seconds < 0:
            raise ConfigError(f"shutdown_grace_seconds must be >= 0, got {self.shutdown_grace_seconds}; "
                              "set PGWORKER_SHUTDOWN_GRACE_SECONDS")
        if not 1 <= self.max_batch_size <= 10_000:
            raise ConfigError(f"max_batch_size must be between 1 and 10000, got {self.max_batch_size}; "
                              "set PGWORKER_MAX_BATCH_SIZE")
        if self.batch_size is not None and not 1 <= self.batch_size <= self.max_batch_size:
            raise ConfigError(f"batch_size must be between 1 and max_batch_size ({self.max_batch_size}), got "
                              f"{self.batch_size}; set PGWORKER_BATCH_SIZE (or auto), or raise PGWORKER_MAX_BATCH_SIZE")
        if self.max_payload_bytes < 2:
            raise ConfigError(f"max_payload_bytes must be at least 2, got {self.max_payload_bytes}; set PGWORKER_MAX_PAYLOAD_BYTES")
        if not 1 <= self.error_history_entries <= 1000:
            raise ConfigError(f"error_history_entries must be between 1 and 1000, got {self.error_history_entries}; "
                              "set PGWORKER_ERROR_HISTORY_ENTRIES")
        if not 20 <= self.error_message_max_chars <= 100_000:
            raise ConfigError(f"error_message_max_chars must be between 20 and 100000, got {self.error_message_max_chars}; "
                              "set PGWORKER_ERROR_MESSAGE_MAX_CHARS")
        if not 1 <= self.step_max_per_job <= 100_000:
            raise ConfigError(f"step_max_per_job must be between 1 and 100000, got {self.step_max_per_job}; "
                              "set PGWORKER_STEP_MAX_PER_JOB")
        if not 16 <= self.step_result_max_bytes <= 10_485_760:
            raise ConfigError(f"step_result_max_bytes must be between 16 and 10485760, got {self.step_result_max_bytes}; "
                              "set PGWORKER_STEP_RESULT_MAX_BYTES")
        if not 1 <= self.max_parents <= 100_000:
            raise ConfigError(f"max_parents must be between 1 and 100000, got {self.max_parents}; "
                              "set PGWORKER_MAX_PARENTS")
        if not 2 <= self.result_max_bytes <= 100_000_000:
            raise ConfigError(f"result_max_bytes must be between 2 and 100000000, got {self.result_max_bytes}; "
                              "set PGWORKER_RESULT_MAX_BYTES")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0-65535 (0: no server), got {self.metrics_port}; set PGWORKER_METRICS_PORT")
        if not self.claim_floor_reset_seconds >= 0:
            raise ConfigError(f"claim_floor_reset_seconds must be seconds >= 0 (0: every claim from the start), "
                              f"got {self.claim_floor_reset_seconds}; set PGWORKER_CLAIM_FLOOR_RESET_SECONDS")
        if self.priority_aging_seconds is not None and not self.priority_aging_seconds > 0:
            raise ConfigError("priority_aging_seconds must be > 0 (or unset for strict priority); "
                              "set PGWORKER_PRIORITY_AGING_SECONDS")
        for q, n in self.queue_concurrency:
            check_queue_name(q)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"queue_concurrency for {q!r} must be an integer >= 1, got {n!r}; "
                                  "set PGWORKER_QUEUE_CONCURRENCY like 'emails=2,reports=1'")
        if len({q for q, _ in self.queue_concurrency}) != len(self.queue_concurrency):
            raise ConfigError("queue_concurrency names a queue twice; give each queue once in PGWORKER_QUEUE_CONCURRENCY")
        for name in ("retention_succeeded_seconds", "retention_cancelled_seconds", "retention_dead_seconds",
                     "retention_queue_events_seconds"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{name} must be seconds >= 0, or off to keep those rows; "
                                  f"set PGWORKER_{name.upper()}")
        if self.synchronous_commit is not None and self.synchronous_commit not in (
                "on", "off", "local", "remote_write", "remote_apply"):
            raise ConfigError(f"synchronous_commit must be one of on, off, local, remote_write, remote_apply, got "
                              f"{self.synchronous_commit!r}; set PGWORKER_SYNCHRONOUS_COMMIT")

    def _check_seconds(self) -> None:
        """Every duration is a finite number of seconds within its bound: NaN passes every
        comparison and infinity overflows the conversions to milliseconds and intervals,
        so either would stop a pod halfway through its start instead of here."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not f.name.endswith("_seconds") or value is None or isinstance(value, bool):
                continue
            limit = MAX_TIMEOUT_SECONDS if f.name in _MILLISECOND_SETTINGS else MAX_SETTING_SECONDS
            env = f.metadata.get("env", f"PGWORKER_{f.name.upper()}")
            if not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > limit:
                raise ConfigError(f"{f.name} must be a finite number of seconds up to {limit:,}, got {value!r}; "
                                  f"set {env}")

    @property
    def effective_renew_interval(self) -> float:
        """Seconds between lease renewals (a third of the lease unless set)."""
        return self.renew_interval_seconds or self.lease_seconds / 3.0

    @property
    def effective_listen_dsn(self) -> str | None:
        return self.listen_dsn or self.dsn

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """The settings as a dict safe to print (passwords redacted)."""
        out = dataclasses.asdict(self)
        out["dsn"] = redact_dsn(self.dsn)
        out["listen_dsn"] = redact_dsn(self.listen_dsn)
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Settings from ``PGWORKER_*`` variables, with ``overrides`` (not None) winning.

        Raises :class:`ConfigError` when a variable does not parse, naming it.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            env = f.metadata.get("env")
            if env and env in environ and environ[env] != "":
                try:
                    values[f.name] = f.metadata["parse"](environ[env])
                except ValueError as exc:
                    expected = {float: "a number", int: "a whole number"}.get(f.metadata["parse"])
                    if expected and f.name.endswith("_seconds"):
                        expected += " of seconds, like 10 or 0.5 (no unit)"
                    elif expected and f.name.endswith("_bytes"):
                        expected += " of bytes (no unit)"
                    hint = f"; expected {expected}" if expected else ""
                    raise ConfigError(f"{env}={environ[env]!r} is invalid: {exc}{hint}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            names = [f.name for f in dataclasses.fields(cls)]
            close = {k: difflib.get_close_matches(k, names, n=1, cutoff=0.6)
                     or [n for n in names if n.startswith(f"{k}_")][:1] for k in sorted(unknown)}
            listed = ", ".join(f"{k} (did you mean {c[0]}?)" if c else k for k, c in close.items())
            raise ConfigError(f"unknown settings: {listed}; the settings are pgworker.Settings' fields "
                              "(docs/configuration.md)")
        return cls(**values)


def _variable(name: str) -> str:
    """The environment variable of the setting ``name`` (for the fix an error names)."""
    return str(next(f.metadata["env"] for f in dataclasses.fields(Settings) if f.name == name))


def env_var_names() -> dict[str, str]:
    """Map of setting name to its environment variable (for docs and --help)."""
    return {f.name: f.metadata["env"] for f in dataclasses.fields(Settings) if f.metadata.get("env")}

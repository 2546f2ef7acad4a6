"""App: settings, the task registry, and the public operations on jobs; the one facade.
Its methods delegate the work to :mod:`pgworker.connections` (the client pool),
:mod:`pgworker.lifecycle` (claim and settle) and :mod:`pgworker.operations` (operator actions)."""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator, Sequence, overload

import psycopg

from . import connections, db, graphs, lifecycle, operations, results
from .config import Settings
from .dependencies import enqueue_graph, has_dependencies
from .errors import ConfigError
from .jobs import ClaimedJob, Lease, ReapResult, ReplayResult
from .migrate import MigrationReport, migrate
from .names import redact_dsn
from .operations import PRUNE_BATCH, UNSET
from .aio import AsyncProducer
from .producer import JobSpec, Preparer, check_on_conflict, enqueue_batch, enqueue_one, specs_from
from .retry import Classifier, RetryPolicy
from .schedules import MISFIRE_GRACE_SECONDS, Periodic
from .store import Store
from .tasks import DEFAULT_MAX_ATTEMPTS, Task, check_dedupe_window


class App(AsyncProducer):
    """A pgworker application: where jobs live (DSN, schema) and which tasks exist.

    ``App(dsn)`` or ``App(settings=Settings.from_env())``. Settings not given are read
    from ``PGWORKER_*`` environment variables (see :class:`pgworker.Settings`).
    ``classify_error(exc)`` may return True (permanent), False (retry), a
    :class:`pgworker.retry.FailureClass`, or None (default rules).
    Raises :class:`ConfigError` for invalid settings (a malformed DSN included).
    """

    def __init__(self, dsn: str | None = None, *, schema: str | None = None,
                 settings: Settings | None = None, classify_error: Classifier | None = None,
                 name: str = "pgworker") -> None:
        if settings is None:
            settings = Settings.from_env(dsn=dsn, schema=schema)
        elif dsn is not None or schema is not None:
            settings = settings.replace(**{k: v for k, v in (("dsn", dsn), ("schema", schema)) if v is not None})
        if settings.dsn is not None:
            db.check_dsn(settings.dsn)
        self.settings = settings
        self.name = name
        self.store = Store(settings.schema, error_history_entries=settings.error_history_entries)
        self.tasks: dict[str, Task] = {}
        self._prepared = Preparer(self.tasks, settings.max_payload_bytes)
        self.schedules: dict[str, Periodic] = {}
        self.classify_error = classify_error
        self._pool: Any = None
        self._metrics: Any = None

    def configure(self, settings: Settings) -> None:
        """Replace the settings (the CLI's flags win over what the app module set)."""
        if settings.dsn is not None:
            db.check_dsn(settings.dsn)
        self.close()
        self._drop_apool()
        self.settings = settings
        self.store = Store(settings.schema, error_history_entries=settings.error_history_entries)
        self._prepared = Preparer(self.tasks, settings.max_payload_bytes)

    def __repr__(self) -> str:
        return f"App(dsn={redact_dsn(self.settings.dsn)!r}, schema={self.settings.schema!r}, tasks={sorted(self.tasks)})"

    # -- tasks ----------------------------------------------------------------------

    @overload
    def task(self, func: Callable[..., Any], /) -> Task: ...

    @overload
    def task(self, func: None = None, /, *, name: str | None = None,
             queue: str | None = None, max_attempts: int | None = None,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             max_runtime: float | None = None, renew: str | None = None, priority: int = 0,
             permanent_errors: Sequence[type[BaseException]] = (),
             payload_type: Callable[..., Any] | None = None, ordering_on_dead: str = "block",
             dedupe_window: "float | timedelta | None" = None, schedule: str | None = None,
             schedule_tz: str = "UTC", schedule_missed: str = "latest") -> Callable[[Callable[..., Any]], Task]: ...

    def task(self, func: Callable[..., Any] | None = None, *, name: str | None = None,
             queue: str | None = None, max_attempts: int | None = None,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             max_runtime: float | None = None, renew: str | None = None, priority: int = 0,
             permanent_errors: Sequence[type[BaseException]] = (),
             payload_type: Callable[..., Any] | None = None, ordering_on_dead: str = "block",
             dedupe_window: "float | timedelta | None" = None, schedule: str | None = None,
             schedule_tz: str = "UTC", schedule_missed: str = "latest") -> "Task | Callable[[Callable[..., Any]], Task]":
        """Register a handler: ``@app.task`` or ``@app.task(name=..., queue=...)``.

        The handler is ``def f(payload)`` or ``def f(payload, ctx)`` (``async def`` too);
        ``ctx`` is a :class:`pgworker.JobContext`. ``timeout`` and ``max_runtime`` are in
        seconds. ``ordering_on_dead``: 'block' (a dead job holds its ordering key until
        replayed or discarded) or 'skip'. ``dedupe_window``: seconds after success during
        which the job's dedupe key stays held. ``schedule``: a cron expression (five
        fields) in ``schedule_tz`` (IANA name); the supervisor enqueues one job (payload
        None) per slot, ``schedule_missed`` ('latest' or 'skip') deciding about slots
        missed while no worker ran; see :meth:`periodic` and docs/scheduling.md.
        Returns the :class:`pgworker.Task`, which can still be called directly.
        Raises :class:`ConfigError` for a duplicate name or invalid option.
        """

        def register(fn: Callable[..., Any]) -> Task:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}".removeprefix("__main__.")
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice; give one of them another name=")
            kwargs: dict[str, Any] = {}
            if max_attempts is not None:
                kwargs["max_attempts"] = max_attempts
            if retry is not None:
                kwargs["retry"] = retry
            if renew is not None:
                kwargs["renew"] = renew
            task = Task(name=task_name, func=fn, queue="default" if queue is None else queue, timeout_seconds=timeout,
                        max_runtime_seconds=max_runtime, priority=priority,
                        permanent_errors=tuple(permanent_errors), payload_type=payload_type,
                        ordering_on_dead=ordering_on_dead,
                        dedupe_window_seconds=check_dedupe_window(dedupe_window), app=self, **kwargs)
            if schedule is not None:
                self.periodic(task, schedule, tz=schedule_tz, missed=schedule_missed)
            self.tasks[task_name] = task
            return task

        return register(func) if func is not None else register

    def periodic(self, task: "str | Task", cron: str, *, name: str | None = None, tz: str = "UTC",
                 missed: str = "latest", payload: Any = None, queue: str | None = None,
                 priority: int | None = None, max_attempts: int | None = None,
                 misfire_grace: float = MISFIRE_GRACE_SECONDS) -> Periodic:
        """Enqueue a job of ``task`` at every slot of the cron expression ``cron``.

        ``cron``: minute hour day-of-month month day-of-week (croniter syntax), read in
        the time zone ``tz`` (IANA name, default UTC). ``name``: the schedule's identity in
        the database (default the task name; give each schedule of a task its own).
        ``missed``: after downtime, 'latest' runs the latest missed slot once; 'skip' runs
        it only if it is less than ``misfire_grace`` seconds late. Each slot is enqueued at
        most once however many supervisors run (``pgworker run``; a ``--drain`` run fires
        due slots at its start). ``payload``, ``queue``, ``priority``, ``max_attempts``
        default to the task's, and are checked now as :meth:`enqueue` checks them (JSON
        without NaN, at most ``max_payload_bytes``; priority -32768..32767; max_attempts
        1..1000000). Raises :class:`ConfigError` naming the schedule and the fix for an invalid
        expression (or one no date has: '0 0 30 2 *'), zone, policy or job option, or a name declared twice.
        """
        registered = task if isinstance(task, Task) else self.tasks.get(task)
        task_name = task.name if isinstance(task, Task) else task
        schedule_name = name or task_name
        if schedule_name in self.schedules:
            raise ConfigError(f"schedule {schedule_name!r} is declared twice; give one of them name=...")
        # `is not None`, not `or`: an explicit 0 or '' is checked (and refused), not replaced
        p = Periodic(
            name=schedule_name, task=task_name, cron=cron, timezone=tz, missed=missed, payload=payload,
            queue=queue if queue is not None else (registered.queue if registered else "default"),
            priority=priority if priority is not None else (registered.priority if registered else 0),
            max_attempts=max_attempts if max_attempts is not None else (
                registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS),
            misfire_grace_seconds=misfire_grace, max_payload_bytes=self.settings.max_payload_bytes)
        self.schedules[schedule_name] = p
        return p

    def queues(self) -> tuple[str, ...]:
        """The queues a worker of this app claims from: the configured ones, else those
        of the registered tasks (and 'default')."""
        if self.settings.queues:
            return self.settings.queues
        return tuple(sorted({"default", *(t.queue for t in self.tasks.values())}))

    # -- connections ----------------------------------------------------------------

    def connect(self, *, application_name: str = "pgworker", autocommit: bool = True) -> psycopg.Connection:
        """A new connection to the app's database (caller closes it)."""
        return db.connect(self.settings.dsn, application_name=application_name, autocommit=autocommit,
                          prepare=self.settings.prepared_statements)

    def _get_pool(self) -> Any:
        if self._pool is None:
            self._pool = connections.open_pool(self.settings, self.name)
        return self._pool

    @contextlib.contextmanager
    def connection(self, conn: psycopg.Connection | None = None) -> Iterator[psycopg.Connection]:
        """``conn`` if given (the caller's transaction), else a pooled autocommit connection."""
        connections.require_sync(conn, None)
        with connections.database_errors(self.settings):
            if conn is not None:
                yield conn
                return
            with connections.borrow(self._get_pool()) as pooled:
                yield pooled

    def close(self) -> None:
        """Close the connection pool (safe to call twice)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "App":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def metrics(self) -> Any:
        if self._metrics is None:
            from .metrics import process_metrics

            self._metrics = process_metrics(task_label=self.settings.metrics_task_label)
        return self._metrics

    # -- schema ---------------------------------------------------------------------

    def migrate(self) -> MigrationReport:
        """Apply pending migrations (see :func:`pgworker.migrate.migrate`)."""
        with contextlib.closing(self.connect(application_name=f"{self.name}:migrate")) as conn:
            return migrate(conn, self.settings.schema)

    def check_schema(self) -> int:
        """Raise :class:`SchemaNotMigrated` / :class:`SchemaTooNew` unless the database is
        on this pgworker's schema version; returns the version."""
        with self.connection() as conn:
            return self.store.check_schema_version(conn)

    # -- producing ------------------------------------------------------------------

    def enqueue(self, task: "str | Task", payload: Any = None, *, queue: str | None = None,
                priority: int | None = None, run_at: datetime | None = None,
                delay: "float | timedelta | None" = None, max_attempts: int | None = None,
                dedupe_key: str | None = None, ordering_key: str | None = None,
                dedupe_window: "float | timedelta | None" = None, ordering_on_dead: str | None = None,
                depends_on: "Sequence[int] | None" = None, on_parent_failure: str | None = None,
                graph_id: int | None = None, any_task: bool = False, on_conflict: str = "return",
                conn: psycopg.Connection | None = None) -> int:
        """Enqueue one job and return its id.

        ``task``: a :class:`Task`, or a task name. When this App has registered tasks, a
        name must be one of them: a typo raises :class:`UnknownTask` with the closest
        names instead of making a job no worker can run. ``any_task=True`` enqueues a
        name this App does not register (a task another service's worker handles), as an
        App with no tasks (a pure producer) always does; such a job takes the queue
        'default' unless one is given, and 5 attempts. ``payload: JSON-serialisable, at most ``max_payload_bytes``
        (default 1 MiB). ``run_at`` (timezone-aware, from 1970-01-01 UTC to 100 years from
        now; a past one is due now) or ``delay`` (seconds, or a timedelta) defers it. ``priority``: higher runs first. ``dedupe_key``: while a
        job with this key is pending or running (and, with ``dedupe_window`` seconds, for
        that long after it succeeded), enqueueing another returns that job's id instead;
        a unique index decides, and a duplicate never aborts the caller's transaction.
        ``on_conflict='raise'`` raises :class:`AlreadyEnqueued` instead (its ``job_id`` the
        holder's), so the caller can tell a duplicate from a new job.
        ``ordering_key``: jobs sharing it run one at a time in enqueue order;
        ``ordering_on_dead`` ('block' or 'skip', default the task's) says whether this job,
        if it dies, holds the key's later jobs back. See docs/scheduling.md.
        ``depends_on``: ids of jobs this one waits for (at most ``max_parents``); it stays
        pending and blocked until every one has succeeded, and the statement that completes
        the last one makes it due. ``on_parent_failure``: 'hold' (default: a dead parent
        holds it until replayed) or 'cancel' (cancelled with the parent's reason).
        ``graph_id``: the graph it belongs to (default: its parents'). See docs/graphs.md.
        ``conn``: run inside the caller's transaction (a rollback leaves no job and no
        wake-up); otherwise a pooled connection commits at once.

        Raises :class:`InvalidName`, :class:`PayloadError` or :class:`InvalidJob` (its
        subclass :class:`UnknownTask` included; all ``ValueError``) before touching the
        database, and :class:`DatabaseUnavailable` when PostgreSQL cannot be reached.
        """
        connections.require_sync(conn, "aenqueue")
        spec = JobSpec(task, payload, queue, priority, run_at, delay, max_attempts, dedupe_key, ordering_key,
                       dedupe_window, ordering_on_dead, depends_on=depends_on, on_parent_failure=on_parent_failure,
                       graph_id=graph_id)
        job = self._prepared.one(spec, any_task)
        check_on_conflict(on_conflict)
        if has_dependencies(spec) or on_parent_failure is not None:
            with self.connection(conn) as c:
                return enqueue_graph(self.store, c, [spec], [job], max_parents=self.settings.max_parents,
                                     single=True, metrics=self.metrics)[0]
        with self.connection(conn) as c:
            return enqueue_one(self.store, c, job, self.metrics, on_conflict)

    def enqueue_many(self, jobs: Iterable["JobSpec | dict[str, Any] | tuple[Any, Any]"], *,
                     any_task: bool = False, on_conflict: str = "return",
                     conn: psycopg.Connection | None = None) -> list[int]:
        """Enqueue many jobs in one transaction and return their ids in input order.

        Items are :class:`JobSpec`, dicts of its fields, or ``(task, payload)`` tuples.
        Jobs without dedupe or ordering keys go in through COPY; one NOTIFY per queue.
        Every job is validated before anything is written: one bad item (a task name
        this App does not register included, unless ``any_task=True``: see
        :meth:`enqueue`) raises and inserts nothing. A job whose dedupe key is held gets
        the holder's id; with ``on_conflict='raise'`` the batch raises
        :class:`AlreadyEnqueued` (``held_by``: {position: holder id}) and inserts nothing
        (in the caller's transaction through a savepoint: the transaction stays usable).

        Dependencies within the call: a job's ``depends_on`` may name the ``ref`` of an
        earlier job of the call (or an existing job's id); the call's jobs then share a
        graph id (the first job's, unless given). See docs/graphs.md.
        """
        connections.require_sync(conn, "aenqueue_many")
        specs = specs_from(jobs)
        prepared = self._prepared.many(specs, any_task)
        check_on_conflict(on_conflict)
        if any(has_dependencies(s) or s.on_parent_failure is not None for s in specs):
            with self.connection(conn) as c:
                return enqueue_graph(self.store, c, specs, prepared, max_parents=self.settings.max_parents,
                                     metrics=self.metrics)
        with self.connection(conn) as c:
            return enqueue_batch(self.store, c, prepared, self.metrics, on_conflict)

    # -- the lifecycle, for custom consumers and tests --------------------------------

    def worker_id(self, suffix: str = "") -> str:
        base = self.settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
        return f"{base}{':' + suffix if suffix else ''}"

    def claim(self, queue: str = "default", *, limit: int = 1, lease_seconds: float | None = None,
              owner: str | None = None, conn: psycopg.Connection | None = None) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue`` under a lease (seconds; default the
        setting). The claim commits at once; settle each job with :meth:`complete`,
        :meth:`fail` or :meth:`release` before the lease expires, or renew it."""
        return lifecycle.claim(self, queue, limit=limit, lease_seconds=lease_seconds, owner=owner, conn=conn)

    def complete(self, job: "ClaimedJob | Lease", *, result: Any = None,
                 conn: psycopg.Connection | None = None) -> None:
        """Mark a claimed job succeeded, storing ``result`` (JSON; None stores nothing) with
        the success. Raises :class:`LeaseLost` when the fence refuses the write (the token
        moved on or the lease expired): the job is not yours, and its result is not stored;
        ``ValueError`` when ``result`` is not JSON or longer than ``result_max_bytes``
        (nothing written)."""
        lifecycle.complete(self, job, result=result, conn=conn)

    def fail(self, job: "ClaimedJob | Lease", error: BaseException, *, attempt: int | None = None,
             retry: RetryPolicy | None = None, conn: psycopg.Connection | None = None) -> str:
        """Record a failed attempt; returns the job's new state: 'pending' (retry after
        ``retry``'s backoff, else the job's task's), 'dead', or 'cancelled' when a
        cancellation was requested. Raises :class:`LeaseLost` when fenced out."""
        return lifecycle.fail(self, job, error, attempt=attempt, retry=retry, conn=conn)

    def renew(self, job: "ClaimedJob | Lease", *, lease_seconds: float | None = None,
              conn: psycopg.Connection | None = None) -> bool:
        """Extend the lease from now; returns True when a cancellation was requested.
        Raises :class:`LeaseLost` when fenced out."""
        return lifecycle.renew(self, job, lease_seconds=lease_seconds, conn=conn)

    def release(self, job: "ClaimedJob | Lease", *, conn: psycopg.Connection | None = None) -> None:
        """Hand a claimed job back without spending an attempt. Raises :class:`LeaseLost`."""
        lifecycle.release(self, job, conn=conn)

    def reap(self, *, limit: int = 1000, retry: RetryPolicy | None = None) -> ReapResult:
        """Recover up to ``limit`` expired leases: back to pending after the retry policy
        of the job's task (``retry`` overrides it for every job), dead once its attempts
        are spent, cancelled when a cancellation was requested. Rows other sessions hold
        locked, and leases of ordering keys locked elsewhere (``skipped``), are left for
        later; a row that cannot be written (a CHECK constraint or trigger refuses it) is
        in ``failed``, and the rest of the batch is reaped."""
        return lifecycle.reap(self, limit=limit, retry=retry)

    # -- operator actions -----------------------------------------------------------

    def cancel(self, job_id: int, *, actor: str | None = None,
               conn: psycopg.Connection | None = None) -> str | None:
        """Cancel a job: pending or dead jobs become cancelled at once ('cancelled' is
        returned); a running job gets a cancellation request its worker sees at the next
        lease renewal ('running' is returned). None when the job is finished or unknown."""
        connections.require_sync(conn, "acancel")
        return operations.cancel(self, job_id, actor=actor, conn=conn)

    def replay(self, job_ids: Sequence[int] = (), *, queue: str | None = None, limit: int = 1000,
               actor: str | None = None, clean: bool = False) -> ReplayResult:
        """Put dead jobs back to pending (same ids, history kept, audited); by id, or up to
        ``limit`` dead jobs of ``queue``. Returns a :class:`ReplayResult`, the list of replayed ids with
        ``held_by`` ({id: id of the job holding its dedupe key}) and ``not_dead`` (not dead, or unknown).
        The jobs keep their recorded steps and effects (``ctx.step``, ``ctx.effect``) unless
        ``clean``: then they are forgotten in the same transaction and run again."""
        return operations.replay(self, job_ids, queue=queue, limit=limit, actor=actor, clean=clean)

    def resolve_effect(self, job_id: int, name: str, *, result: Any = UNSET, retry: bool = False,
                       actor: str | None = None) -> str:
        """Resolve an external effect left uncertain (``EFFECT_UNCERTAIN``: started by an
        attempt that never recorded its end): ``result`` (JSON) marks it done, as if the
        call had returned it (the destination says it happened); ``retry=True`` forgets the
        record, so that the next attempt calls again with the same idempotency key. Only
        while the job is not running; replay a dead job afterwards. Returns the job's
        state; raises :class:`ConfigError` when there is no such started effect, or when
        neither (or both) of ``result`` and ``retry=True`` is given (``result=None`` marks
        it done with a null result)."""
        if (result is UNSET) == (not retry):
            raise ConfigError(f"resolve_effect({job_id}, {name!r}): give result= (the effect happened: its JSON "
                              "result, None allowed) or retry=True (call it again with the same idempotency "
                              "key), exactly one of them")
        if result is UNSET:
            result = None
        return operations.resolve_effect(self, job_id, name, result=result, retry=retry, actor=actor)

    def prune(self, older_than: "float | timedelta", *, batch: int = PRUNE_BATCH) -> int:
        """Delete succeeded and cancelled jobs finished more than ``older_than`` (seconds
        or timedelta) ago, in batches of ``batch``; returns how many were deleted. (The
        worker's pruner does this by itself, per state: see the ``retention_*`` settings.)"""
        return operations.prune(self, older_than, batch=batch)

    def retry(self, job_id: int, *, actor: str | None = None) -> dict[str, Any] | None:
        """Retry now: a pending job scheduled later (a retry's backoff, a delay) becomes due
        at once, audited ('retried_now', with the run_at it had). Returns {id, queue,
        previous_run_at}, or None when it is not pending with a run_at still ahead."""
        return operations.retry(self, job_id, actor=actor)

    # -- queues ---------------------------------------------------------------------

    def pause_queue(self, queue: str, *, actor: str | None = None) -> dict[str, Any]:
        """Pause ``queue``: no claim of any pod takes its jobs from the commit on; running
        jobs finish; enqueues go on. Audited with ``actor`` (default $PGWORKER_ACTOR or
        user@host). Returns the queue's row (paused_at, paused_by)."""
        return operations.pause_queue(self, queue, actor=actor)

    def resume_queue(self, queue: str, *, actor: str | None = None) -> bool:
        """Resume a paused queue (and wake idle claimers); False if it was not paused."""
        return operations.resume_queue(self, queue, actor=actor)

    def configure_queue(self, queue: str, *, concurrency_limit: "int | None" = UNSET,
                        rate_limit: "float | None" = UNSET, burst: "float | None" = None,
                        aging: "float | timedelta | None" = UNSET, actor: str | None = None) -> dict[str, Any]:
        """Set a queue's policies, enforced by every pod's claims (docs/scheduling.md).

        ``concurrency_limit``: most jobs of the queue running at once across all pods.
        ``rate_limit``: jobs per second (a token bucket holding up to ``burst`` tokens,
        default max(1, rate_limit)). ``aging``: seconds after which a due job is claimed
        before higher-priority work. None removes a setting; omitted ones stay as they
        are. Audited with ``actor``. Raises :class:`ConfigError` for invalid values.
        """
        return operations.configure_queue(self, queue, concurrency_limit=concurrency_limit, rate_limit=rate_limit,
                                          burst=burst, aging=aging, actor=actor)

    def delete_queue(self, queue: str, *, actor: str | None = None) -> dict[str, Any] | None:
        """Delete ``queue``'s settings row: its limits, token bucket and aging bound (a
        row is made by :meth:`pause_queue` or :meth:`configure_queue`, for a typo too).
        Jobs are not touched; those of the queue then run without its policies. Audited
        with ``actor``, the removed settings in the event's detail. Returns the removed
        settings (concurrency_limit, rate_per_second, rate_burst, aging_seconds), or None
        when the queue had no row.

        Raises :class:`QueuePaused` for a paused queue: deleting its row would resume it
        with no 'resumed' event and no wake-up; :meth:`resume_queue` first.
        """
        return operations.delete_queue(self, queue, actor=actor)

    def queue_usage(self, queue: str) -> dict[str, bool]:
        """Whether anything uses the queue name: ``has_jobs`` (claimable, running or dead
        jobs), ``recently_finished`` (among the last 1000 succeeded or cancelled), ``scheduled``
        (a recorded schedule enqueues into it), ``configured`` (a settings row), ``has_events``
        (an audit event), ``in_app`` (one of :meth:`queues`: a registered task's, or a configured one)."""
        return operations.queue_usage(self, queue)

    def queue_settings(self) -> list[dict[str, Any]]:
        """Every configured queue: pause, limits, aging, and its running jobs."""
        with self.connection() as c:
            return self.store.list_queues(c)

    def queue_events(self, queue: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """The audit trail of a queue (pause, resume, configuration), newest first."""
        with self.connection() as c:
            return self.store.queue_events(c, queue, limit=limit)

    def list_schedules(self) -> list[dict[str, Any]]:
        """Recorded and declared schedules with their next run (database clock)."""
        from .schedules import describe

        with self.connection() as c:
            rows = self.store.list_schedules(c)
            now = self.store.db_now(c)
        # an App with tasks is the user's code: its schedules are all there are
        return describe(self.schedules, rows, now, app_known=bool(self.tasks or self.schedules))

    def result(self, job_id: int, *, conn: psycopg.Connection | None = None) -> Any:
        """What job ``job_id``'s handler returned (decoded JSON; None when it returned nothing).

        Raises :class:`ResultNotReady` while the job is pending or running,
        :class:`JobDidNotSucceed` when it ended dead or cancelled (``state``, ``code``),
        :class:`ResultLost` when its success was recorded without its result, and
        :class:`JobNotFound` when there is no such job (or it was pruned, result included).
        """
        return results.result(self, job_id, conn)

    def wait_result(self, job_id: int, *, timeout: float, poll_seconds: float = results.WAIT_POLL_SECONDS) -> Any:
        """:meth:`result`, waiting up to ``timeout`` seconds for the job to finish.

        Woken by the NOTIFY of the statement that completes it (its own connection, with
        LISTEN), and re-reading at least every ``poll_seconds`` (a failure or cancellation
        sends no notification). Raises :class:`ResultTimeout` (a ``TimeoutError``) at the
        timeout, and what :meth:`result` raises once the job has finished.
        """
        return results.wait_result(self, job_id, timeout=timeout, poll_seconds=poll_seconds)

    async def wait_result_async(self, job_id: int, *, timeout: float,
                                poll_seconds: float = results.WAIT_POLL_SECONDS) -> Any:
        """:meth:`wait_result` for asyncio code: the same as :meth:`await_result` (an async
        LISTEN, no thread; kept for the name it was released with)."""
        return await results.wait_result_async(self, job_id, timeout=timeout, poll_seconds=poll_seconds)

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row (payload, error history, audit events), or None."""
        with self.connection() as c:
            return self.store.get_job(c, job_id)

    def list_jobs(self, *, queue: str | None = None, state: str | None = None,
                  limit: int = 50, graph_id: int | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first, by queue and state, or the jobs of one graph (``graph_id``)."""
        with self.connection() as c:
            return self.store.list_jobs(c, queue=queue, state=state, limit=limit, graph_id=graph_id)

    # -- graphs (docs/graphs.md) ----------------------------------------------------------

    def chain(self, jobs: Sequence[Any], *, on_parent_failure: str | None = None,
              conn: psycopg.Connection | None = None) -> "graphs.Graph":
        """Enqueue jobs that run one after another; see :func:`pgworker.graphs.chain`."""
        return graphs.chain(self, jobs, on_parent_failure=on_parent_failure, conn=conn)

    def group(self, jobs: Sequence[Any], *, callback: Any = None, on_parent_failure: str | None = None,
              conn: psycopg.Connection | None = None) -> "graphs.Graph":
        """Enqueue independent jobs and a callback run when all succeeded; see :func:`pgworker.graphs.group`."""
        return graphs.group(self, jobs, callback=callback, on_parent_failure=on_parent_failure, conn=conn)

    def cancel_graph(self, graph_id: int, *, actor: str | None = None) -> dict[str, Any]:
        """Cancel every unfinished job of a graph; see :func:`pgworker.graphs.cancel_graph`."""
        return graphs.cancel_graph(self, graph_id, actor=actor)

    def replay_graph(self, graph_id: int, *, actor: str | None = None) -> graphs.ReplayedGraph:
        """Replay a graph's dead jobs and what their death cancelled; see :func:`pgworker.graphs.replay_graph`."""
        return graphs.replay_graph(self, graph_id, actor=actor)

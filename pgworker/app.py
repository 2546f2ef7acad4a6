"""App: the public API, a façade. It owns a :class:`pgworker.core.Core` (settings, store,
task registry, client pool, metrics) and its methods delegate to the modules that take
that core: :mod:`pgworker.producer` (enqueue), :mod:`pgworker.lifecycle` (claim and settle),
:mod:`pgworker.results`, :mod:`pgworker.graphs`, :mod:`pgworker.declare` (tasks and
schedules); the operator's calls are the :class:`pgworker.admin.Admin` mixin's (over
:mod:`pgworker.operations`), the coroutines :class:`pgworker.aio.AsyncProducer`'s. None
of them imports this module."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, TypeVar, overload

import psycopg

from . import declare, graphs, lifecycle, producer, results
from .admin import Admin
from .aio import AsyncProducer
from .config import Settings
from .connections import with_schema_hint
from .core import Core
from .enqueue_options import OnConflict
from .errors import SchemaNotMigrated
from .jobs import ClaimedJob, Lease, ReapResult
from .jobspec import JobSpec
from .migrate import MigrationReport, migrate
from .names import redact_dsn
from .retry import Classifier, RetryPolicy
from .schedules import MISFIRE_GRACE_SECONDS, Periodic
from .store import Store
from .tasks import Task

if TYPE_CHECKING:
    from .context import JobContext
    from .tasks import TaskDecorator

_P = TypeVar("_P")


class App(AsyncProducer, Admin):
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
        self.tasks: dict[str, Task[Any]] = {}
        self.core = Core(settings, name=name, tasks=self.tasks, classify_error=classify_error)
        self.schedules: dict[str, Periodic] = {}

    def configure(self, settings: Settings) -> None:
        """Replace the settings (the CLI's flags win over what the app module set)."""
        self.core.configure(settings)
        self._drop_apool()

    # the core's state, read (and classify_error set) through the App as before the core existed
    @property
    def settings(self) -> Settings:
        return self.core.settings

    @property
    def store(self) -> Store:
        return self.core.store

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def classify_error(self) -> Classifier | None:
        return self.core.classify_error

    @classify_error.setter
    def classify_error(self, value: Classifier | None) -> None:
        self.core.classify_error = value

    @property
    def metrics(self) -> Any:
        return self.core.metrics

    def __repr__(self) -> str:
        return f"App(dsn={redact_dsn(self.settings.dsn)!r}, schema={self.settings.schema!r}, tasks={sorted(self.tasks)})"

    # -- tasks ----------------------------------------------------------------------

    # The handler's payload type becomes the Task's (Task[P]: its enqueue takes a P), with
    # or without the context parameter. Returns are `object`, and no `Callable[..., Any]`
    # fallback: with one, mypy read a handler returning `dict[str, Any]` as matching both
    # (Any makes overloads ambiguous) and gave a Task[Any], unchecked (a new user's trial).
    # A handler of another shape (`*args`, a partial) matches the first with P = Any.
    @overload
    def task(self, func: Callable[[_P], object], /) -> Task[_P]: ...

    @overload
    def task(self, func: Callable[[_P, JobContext], object], /) -> Task[_P]: ...

    @overload
    def task(self, func: None = None, /, *, name: str | None = None,
             queue: str | None = None, max_attempts: int | None = None,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             max_runtime: float | None = None, renew: str | None = None, priority: int = 0,
             permanent_errors: Sequence[type[BaseException]] = (),
             payload_type: None = None, ordering_on_dead: str = "block",
             dedupe_window: "float | timedelta | None" = None, schedule: str | None = None,
             schedule_tz: str = "UTC", schedule_missed: str = "latest") -> TaskDecorator: ...

    # payload_type= given: what is enqueued is what it decodes (JSON, for a decoding
    # callable), not the handler's parameter type: a Task[Any]
    @overload
    def task(self, func: None = None, /, *, name: str | None = None,
             queue: str | None = None, max_attempts: int | None = None,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             max_runtime: float | None = None, renew: str | None = None, priority: int = 0,
             permanent_errors: Sequence[type[BaseException]] = (),
             payload_type: Callable[..., Any], ordering_on_dead: str = "block",
             dedupe_window: "float | timedelta | None" = None, schedule: str | None = None,
             schedule_tz: str = "UTC", schedule_missed: str = "latest") -> Callable[[Callable[..., Any]], Task[Any]]: ...

    def task(self, func: Callable[..., Any] | None = None, *, name: str | None = None,
             queue: str | None = None, max_attempts: int | None = None,
             retry: RetryPolicy | None = None, timeout: float | None = None,
             max_runtime: float | None = None, renew: str | None = None, priority: int = 0,
             permanent_errors: Sequence[type[BaseException]] = (),
             payload_type: Callable[..., Any] | None = None, ordering_on_dead: str = "block",
             dedupe_window: "float | timedelta | None" = None, schedule: str | None = None,
             schedule_tz: str = "UTC", schedule_missed: str = "latest") -> "Task[Any] | TaskDecorator":
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

        def register(fn: Callable[..., Any]) -> Task[Any]:
            task = declare.new_task(fn, self.tasks, name=name, queue=queue, max_attempts=max_attempts, retry=retry,
                                    timeout=timeout, max_runtime=max_runtime, renew=renew, priority=priority,
                                    permanent_errors=permanent_errors, payload_type=payload_type,
                                    ordering_on_dead=ordering_on_dead, dedupe_window=dedupe_window, app=self)
            declare.adopt_task(self.schedules, task)  # schedules declared by its name before it
            if schedule is not None:
                self.periodic(task, schedule, tz=schedule_tz, missed=schedule_missed)
            self.tasks[task.name] = task
            return task

        return register(func) if func is not None else register

    def periodic(self, task: "str | Task[Any]", cron: str, *, name: str | None = None, tz: str = "UTC",
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
        expression (or one no date has: '0 0 30 2 *'), zone, policy or job option, a name declared twice, or a
        payload the task's handler refuses (its annotated type, checked as enqueue checks it: here when the task
        is registered, else when it is).
        """
        return declare.new_schedule(task, cron, self.schedules, self.tasks, name=name, tz=tz, missed=missed,
                                    payload=payload, queue=queue, priority=priority, max_attempts=max_attempts,
                                    misfire_grace=misfire_grace, max_payload_bytes=self.settings.max_payload_bytes)

    def queues(self) -> tuple[str, ...]:
        """The queues a worker of this app claims from: the configured ones, else those
        of the registered tasks (and 'default')."""
        return self.core.queues()

    # -- connections ----------------------------------------------------------------

    def connect(self, *, application_name: str = "pgworker", autocommit: bool = True) -> psycopg.Connection:
        """A new connection to the app's database (caller closes it)."""
        return self.core.connect(application_name=application_name, autocommit=autocommit)

    def connection(self, conn: psycopg.Connection | None = None) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """``conn`` if given (the caller's transaction), else a pooled autocommit connection."""
        return self.core.connection(conn)

    def close(self) -> None:
        """Close the connection pool (safe to call twice)."""
        self.core.close()

    def __enter__(self) -> "App":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------

    def migrate(self) -> MigrationReport:
        """Apply pending migrations (see :func:`pgworker.migrate.migrate`)."""
        with contextlib.closing(self.connect(application_name=f"{self.name}:migrate")) as conn:
            return migrate(conn, self.settings.schema)

    def check_schema(self) -> int:
        """Raise :class:`SchemaNotMigrated` / :class:`SchemaTooNew` unless the database is
        on this pgworker's schema version; returns the version. A schema absent by that
        name gets the database's pgworker schemas named (a typo, another case)."""
        try:
            with self.connection() as conn:
                return self.store.check_schema_version(conn)
        except SchemaNotMigrated as exc:
            raise with_schema_hint(self.settings, exc) from None

    # -- producing ------------------------------------------------------------------

    def enqueue(self, task: "str | Task[Any]", payload: Any = None, *, queue: str | None = None,
                priority: int | None = None, run_at: datetime | None = None,
                delay: "float | timedelta | None" = None, max_attempts: int | None = None,
                dedupe_key: str | None = None, ordering_key: str | None = None,
                dedupe_window: "float | timedelta | None" = None, ordering_on_dead: str | None = None,
                depends_on: "Sequence[int] | None" = None, on_parent_failure: str | None = None,
                graph_id: int | None = None, any_task: bool = False, on_conflict: OnConflict = "return",
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

        A task this App knows (registered, or given as a Task) has its payload checked as
        its worker will decode it: a dataclass, TypedDict or pydantic payload type by the
        worker's own decode, a handler annotated ``dict``/``Mapping`` for a JSON object; a
        payload that does not fit raises :class:`PayloadError` with the worker's
        PAYLOAD_INVALID message and the fix (``Task.payload_check``; none for an untyped
        handler). A name this App does not know is not checked.

        Raises :class:`InvalidName`, :class:`PayloadError` or :class:`InvalidJob` (its
        subclass :class:`UnknownTask` included; all ``ValueError``) before touching the
        database, and :class:`DatabaseUnavailable` when PostgreSQL cannot be reached.
        """
        spec = JobSpec(task, payload, queue, priority, run_at, delay, max_attempts, dedupe_key, ordering_key,
                       dedupe_window, ordering_on_dead, depends_on=depends_on, on_parent_failure=on_parent_failure,
                       graph_id=graph_id)
        return producer.enqueue(self.core, spec, any_task=any_task, on_conflict=on_conflict, conn=conn)

    def enqueue_many(self, jobs: Iterable["JobSpec | dict[str, Any] | tuple[Any, Any]"], *,
                     any_task: bool = False, on_conflict: OnConflict = "return",
                     conn: psycopg.Connection | None = None) -> list[int]:
        """Enqueue many jobs in one transaction and return their ids in input order.

        Items are :class:`JobSpec`, dicts of its fields, or ``(task, payload)`` tuples.
        Jobs without dedupe or ordering keys go in through COPY; one NOTIFY per queue.
        Every job is validated before anything is written: one bad item (a task name
        this App does not register included, unless ``any_task=True``: see
        :meth:`enqueue`; a payload that does not fit its known task's payload type, as
        :meth:`enqueue` checks it) raises and inserts nothing; a :class:`PayloadError`'s
        message starts with the item's index (``jobs[3]: ...``). A job whose dedupe key is held gets
        the holder's id; with ``on_conflict='raise'`` the batch raises
        :class:`AlreadyEnqueued` (``held_by``: {position: holder id}) and inserts nothing
        (in the caller's transaction through a savepoint: the transaction stays usable).

        Dependencies within the call: a job's ``depends_on`` may name the ``ref`` of an
        earlier job of the call (or an existing job's id); the call's jobs then share a
        graph id (the first job's, unless given). See docs/graphs.md.
        """
        return producer.enqueue_many(self.core, jobs, any_task=any_task, on_conflict=on_conflict, conn=conn)

    # -- the lifecycle, for custom consumers and tests --------------------------------

    def worker_id(self, suffix: str = "") -> str:
        return self.core.worker_id(suffix)

    def claim(self, queue: str = "default", *, limit: int = 1, lease_seconds: float | None = None,
              owner: str | None = None, conn: psycopg.Connection | None = None) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue`` under a lease (seconds; default the
        setting). The claim commits at once; settle each job with :meth:`complete`,
        :meth:`fail` or :meth:`release` before the lease expires, or renew it."""
        return lifecycle.claim(self.core, queue, limit=limit, lease_seconds=lease_seconds, owner=owner, conn=conn)

    def complete(self, job: "ClaimedJob | Lease", *, result: Any = None,
                 conn: psycopg.Connection | None = None) -> None:
        """Mark a claimed job succeeded, storing ``result`` (JSON; None stores nothing) with
        the success. Raises :class:`LeaseLost` when the fence refuses the write (the token
        moved on or the lease expired): the job is not yours, and its result is not stored;
        ``ValueError`` when ``result`` is not JSON or longer than ``result_max_bytes``
        (nothing written)."""
        lifecycle.complete(self.core, job, result=result, conn=conn)

    def fail(self, job: "ClaimedJob | Lease", error: BaseException, *, attempt: int | None = None,
             retry: RetryPolicy | None = None, conn: psycopg.Connection | None = None) -> str:
        """Record a failed attempt; returns the job's new state: 'pending' (retry after
        ``retry``'s backoff, else the job's task's), 'dead', or 'cancelled' when a
        cancellation was requested. Raises :class:`LeaseLost` when fenced out."""
        return lifecycle.fail(self.core, job, error, attempt=attempt, retry=retry, conn=conn)

    def renew(self, job: "ClaimedJob | Lease", *, lease_seconds: float | None = None,
              conn: psycopg.Connection | None = None) -> bool:
        """Extend the lease from now; returns True when a cancellation was requested.
        Raises :class:`LeaseLost` when fenced out."""
        return lifecycle.renew(self.core, job, lease_seconds=lease_seconds, conn=conn)

    def release(self, job: "ClaimedJob | Lease", *, conn: psycopg.Connection | None = None) -> None:
        """Hand a claimed job back without spending an attempt. Raises :class:`LeaseLost`."""
        lifecycle.release(self.core, job, conn=conn)

    def reap(self, *, limit: int = 1000, retry: RetryPolicy | None = None) -> ReapResult:
        """Recover up to ``limit`` expired leases: back to pending after the retry policy
        of the job's task (``retry`` overrides it for every job), dead once its attempts
        are spent, cancelled when a cancellation was requested. Rows other sessions hold
        locked, and leases of ordering keys locked elsewhere (``skipped``), are left for
        later; a row that cannot be written (a CHECK constraint or trigger refuses it) is
        in ``failed``, and the rest of the batch is reaped."""
        return lifecycle.reap(self.core, limit=limit, retry=retry)

    def result(self, job_id: int, *, conn: psycopg.Connection | None = None) -> Any:
        """What job ``job_id``'s handler returned (decoded JSON; None when it returned nothing).

        Raises :class:`ResultNotReady` while the job is pending or running,
        :class:`JobDidNotSucceed` when it ended dead or cancelled (``state``, ``code``),
        :class:`ResultLost` when its success was recorded without its result, and
        :class:`JobNotFound` when there is no such job (or it was pruned, result included).
        """
        return results.result(self.core, job_id, conn)

    def wait_result(self, job_id: int, *, timeout: float | None,
                    poll_seconds: float = results.WAIT_POLL_SECONDS) -> Any:
        """:meth:`result`, waiting up to ``timeout`` seconds (None: without a deadline) for
        the job to finish.

        Woken by the NOTIFY of the statement that completes it (its own connection, with
        LISTEN), and re-reading at least every ``poll_seconds`` (a failure or cancellation
        sends no notification). A connection lost meanwhile (a server restart) is opened
        again, with a short backoff, and the job read again. Raises :class:`ResultTimeout`
        (a ``TimeoutError``) at the timeout, :class:`DatabaseUnavailable` when the server
        could not be reached again before it, and what :meth:`result` raises once the job
        has finished; ``TypeError`` for a job id that is not an int or a timeout that is not
        a number, ``ValueError`` for a negative one.
        """
        return results.wait_result(self.core, job_id, timeout=timeout, poll_seconds=poll_seconds)

    async def wait_result_async(self, job_id: int, *, timeout: float | None,
                                poll_seconds: float = results.WAIT_POLL_SECONDS) -> Any:
        """:meth:`wait_result` for asyncio code: the same as :meth:`await_result` (an async
        LISTEN, no thread; kept for the name it was released with)."""
        return await results.wait_result_async(self.core, job_id, timeout=timeout, poll_seconds=poll_seconds)

    def chain(self, jobs: Sequence[Any], *, on_parent_failure: str | None = None,
              conn: psycopg.Connection | None = None) -> "graphs.Graph":
        """Enqueue jobs that run one after another; see :func:`pgworker.graphs.chain`."""
        return graphs.chain(self.core, jobs, on_parent_failure=on_parent_failure, conn=conn)

    def group(self, jobs: Sequence[Any], *, callback: Any = None, on_parent_failure: str | None = None,
              conn: psycopg.Connection | None = None) -> "graphs.Graph":
        """Enqueue independent jobs and a callback run when all succeeded; see :func:`pgworker.graphs.group`."""
        return graphs.group(self.core, jobs, callback=callback, on_parent_failure=on_parent_failure, conn=conn)
